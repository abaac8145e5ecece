//! The eventfd and RT signal wake pairs that `deploy check --compare` and
//! `deploy bench wake` use, across a process boundary: a forked notifier
//! finds the waiter by its address alone (pidfd_getfd for the eventfd, a
//! queued signal at the waiting thread) and every notification arrives.
#![allow(unsafe_code)] // fork and _exit, to have a second process

use std::time::Duration;

use check::notify::{Address, Notifier, NotifyKind, Waiter};

const NOTIFICATIONS: u64 = 50;

/// Forks a process that connects to `addr` and notifies it `n` times;
/// returns its pid. The child makes only syscalls (no allocation on the
/// success path) and `_exit`s: 0 all sent, 1 connect failed, 2 a
/// notification failed.
fn fork_notifier(addr: Address, n: u64) -> libc::pid_t {
    // SAFETY: fork has no memory-safety preconditions; the child only
    // runs the connect and notify syscalls and then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = match Notifier::connect(&addr) {
            Err(_) => 1,
            Ok(notifier) => {
                let mut code = 0;
                for _ in 0..n {
                    if notifier.notify().is_err() {
                        code = 2;
                    }
                }
                code
            }
        };
        // SAFETY: ends the child without running the parent's state.
        unsafe { libc::_exit(code) }
    }
    pid
}

fn exit_code(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    // SAFETY: waits for our own child; `status` is valid.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid);
    assert!(libc::WIFEXITED(status), "notifier died: status {status}");
    libc::WEXITSTATUS(status)
}

/// Waits on `w` until `n` notifications arrived (watchdog: 10 s).
fn receive_all(w: &Waiter, n: u64) -> u64 {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if rx.recv_timeout(Duration::from_secs(10)).is_err() {
            eprintln!("watchdog: notifications did not arrive in 10s");
            std::process::abort();
        }
    });
    let mut got = 0;
    while got < n {
        got += w.wait().expect("wait");
    }
    let _ = tx.send(());
    let _ = watchdog.join();
    got
}

#[test]
fn a_forked_process_wakes_an_eventfd_waiter_through_pidfd_getfd() {
    if let Err(e) = check::notify::probe_pidfd_getfd() {
        eprintln!("skipped: {e}");
        return;
    }
    let w = Waiter::eventfd().unwrap();
    let addr = w.address();
    assert_eq!(addr.kind, NotifyKind::Eventfd);
    let pid = fork_notifier(addr, NOTIFICATIONS);
    // The child's pid differs from ours: its connect went through
    // pidfd_getfd, not dup.
    let got = receive_all(&w, NOTIFICATIONS);
    assert_eq!(exit_code(pid), 0, "the notifier could not connect or send");
    assert_eq!(got, NOTIFICATIONS);
}

#[test]
fn a_forked_process_queues_one_signal_per_notification() {
    let w = Waiter::signal(libc::SIGRTMIN() + 4).unwrap();
    let addr = w.address();
    assert_eq!(addr.kind, NotifyKind::Signal);
    let pid = fork_notifier(addr, NOTIFICATIONS);
    assert_eq!(exit_code(pid), 0, "the notifier could not send");
    // RT signals queue: every one is there to read, none merged.
    let got = receive_all(&w, NOTIFICATIONS);
    assert_eq!(got, NOTIFICATIONS);
}
