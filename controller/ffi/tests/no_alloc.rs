//! The C interface's publish and handle paths allocate nothing: a loop
//! made through it runs a C-ABI callback that copies a message out, sends
//! by copy and by loan, fetches, reads its context and makes a call that
//! fails (its error written), counted by the runtime's own allocator.

// The interface under test is C's: its calls are unsafe.
#![allow(unsafe_code)]

use std::ffi::{c_void, CString};
use std::path::Path;
use std::time::Duration;

use controller::rt::{allocations, set_alloc_trap, AllocTrap, TrapAlloc};
use controller::shm::TypeRecord;
use controller::{Channel, ChannelGeometry};
use rtdeploy::*;

#[global_allocator]
static ALLOC: TrapAlloc<std::alloc::System> = TrapAlloc(std::alloc::System);

type Msg = [u64; 8];
const WARMUP: u64 = 200;
const N: u64 = 3_000;

struct State {
    echo: *mut RtdSender,
    fetcher: *mut RtdFetcher,
    count: u64,
    before: u64,
    allocated: Option<u64>,
    failures: u64,
}

unsafe extern "C" fn on_message(
    ctx: *mut RtdCtx,
    msg: *const c_void,
    len: usize,
    user: *mut c_void,
) {
    // SAFETY: the test's State, alive for the run; the message is `len`
    // bytes of the loop's copy.
    let st = unsafe { &mut *(user as *mut State) };
    // SAFETY: as above: `len` (checked next) bytes of an 8-aligned copy.
    let m: Msg = unsafe { std::ptr::read(msg as *const Msg) };
    assert_eq!(len, std::mem::size_of::<Msg>());
    st.count += 1;
    if m[0] == 1 {
        return; // the loop's own echo
    }
    if m[1] == WARMUP {
        set_alloc_trap(AllocTrap::Count);
        st.before = allocations();
    }
    let _ = (
        rtd_ctx_now_ns(ctx),
        rtd_ctx_latency_ns(ctx),
        rtd_ctx_lost_before(ctx),
    );
    let echo: Msg = [1, m[1], 0, 0, 0, 0, 0, 0];
    // SAFETY: the sender and fetcher this test made, and valid buffers.
    unsafe {
        if m[1] % 2 == 0 {
            assert_eq!(
                rtd_send(
                    st.echo,
                    echo.as_ptr() as *const c_void,
                    std::mem::size_of::<Msg>()
                ),
                RtdStatus::Ok
            );
        } else {
            let mut slot: *mut c_void = std::ptr::null_mut();
            assert_eq!(rtd_loan(st.echo, &mut slot), RtdStatus::Ok);
            std::ptr::write(slot as *mut Msg, echo);
            assert_eq!(rtd_loan_send(st.echo), RtdStatus::Ok);
        }
        let mut got: *const c_void = std::ptr::null();
        assert_eq!(rtd_fetch_next(st.fetcher, &mut got), RtdStatus::Ok);
        // A call that fails writes its error: no allocation either.
        if rtd_send(st.echo, echo.as_ptr() as *const c_void, 3) == RtdStatus::Argument {
            st.failures += 1;
        }
    }
    if m[1] == N - 1 {
        st.allocated = Some(allocations() - st.before);
        set_alloc_trap(AllocTrap::Off);
        rtd_ctx_exit(ctx);
    }
}

#[test]
fn the_c_interface_allocates_nothing_on_the_publish_and_handle_paths() {
    let dir = tempfile::tempdir().unwrap();
    let (ch, _) = Channel::create(
        dir.path(),
        "/na/ffi",
        &ChannelGeometry::new(64, 8192, 2),
        None,
        Path::new("/proc"),
    )
    .unwrap();
    let rec = TypeRecord::of::<Msg>();
    ch.bind_record(&rec).unwrap();
    let name = CString::new(rec.name.as_str()).unwrap();
    let ty = RtdType {
        name: name.as_ptr(),
        size: rec.size,
        align: rec.align,
        layout_hash: rec.layout_hash,
    };
    let shm = CString::new(dir.path().to_str().unwrap()).unwrap();
    let channel = CString::new("/na/ffi").unwrap();
    let process = CString::new("na").unwrap();
    // SAFETY: valid strings, records and out-pointers throughout.
    unsafe {
        let mut lp = std::ptr::null_mut();
        assert_eq!(
            rtd_loop_new(shm.as_ptr(), process.as_ptr(), &mut lp),
            RtdStatus::Ok
        );
        let mut st = Box::new(State {
            echo: std::ptr::null_mut(),
            fetcher: std::ptr::null_mut(),
            count: 0,
            before: 0,
            allocated: None,
            failures: 0,
        });
        assert_eq!(
            rtd_sender_new(lp, channel.as_ptr(), &ty, &mut st.echo),
            RtdStatus::Ok
        );
        assert_eq!(
            rtd_fetcher_new(lp, channel.as_ptr(), &ty, &mut st.fetcher),
            RtdStatus::Ok
        );
        assert_eq!(
            rtd_watch(
                lp,
                channel.as_ptr(),
                &ty,
                Some(on_message),
                &mut *st as *mut State as *mut c_void
            ),
            RtdStatus::Ok
        );
        let ch2 = ch.clone();
        let t = std::thread::spawn(move || {
            let mut p = ch2.publisher(Path::new("/proc")).unwrap();
            for i in 0..N {
                p.publish_value::<Msg>(&[0, i, 0, 0, 0, 0, 0, 0]).unwrap();
                if i % 4 == 0 {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        });
        assert_eq!(rtd_loop_run(lp), RtdStatus::Ok);
        t.join().unwrap();
        assert_eq!(st.allocated, Some(0), "allocations while handling");
        assert!(st.failures >= N - WARMUP, "{} failures", st.failures);
        rtd_fetcher_free(st.fetcher);
        rtd_sender_free(st.echo);
        rtd_loop_free(lp);
    }
}
