//! Who may talk to the control socket: root, the supervisor's user, or a
//! member of `robot.group`; everyone else is refused, by the socket file's
//! mode and group and, should the mode be loosened, by SO_PEERCRED.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;

use common::{config, process, start};
use serde_json::json;
use services::control::{self, Request};
use services::supervisor::Hooks;

/// Run by the test below as another user: one `status` request, the
/// outcome on stdout.
#[test]
#[ignore = "helper process for control_socket_refuses_users_outside_the_group"]
fn client_helper() {
    let Ok(sock) = std::env::var("RTDEPLOY_TEST_CLIENT_SOCKET") else {
        panic!("run only by control_socket_refuses_users_outside_the_group");
    };
    match control::request(Path::new(&sock), &Request::Status) {
        Ok(r) => println!("HELPER-REPLY {}", serde_json::to_string(&r).unwrap()),
        Err(e) => println!("HELPER-ERROR {e}"),
    }
}

/// The first of `exe` and its directories that others may not enter.
fn not_reachable_by_others(exe: &Path) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::MetadataExt;
    exe.ancestors()
        .find(|p| std::fs::metadata(p).map_or(true, |m| m.mode() & 0o001 == 0))
        .map(Path::to_path_buf)
}

fn as_user(socket: &Path, uid: u32, gid: u32) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "client_helper",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RTDEPLOY_TEST_CLIENT_SOCKET", socket)
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.find("HELPER-").map(|at| &l[at..]))
        .unwrap_or_else(|| {
            panic!(
                "helper printed no outcome: {stdout} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .to_string()
}

#[test]
fn control_socket_refuses_users_outside_the_group() {
    if !common::is_root() {
        eprintln!("skipped: running a client as `nobody` needs root to setuid");
        return;
    }
    if let Some(dir) = not_reachable_by_others(&std::env::current_exe().unwrap()) {
        eprintln!(
            "skipped: `nobody` cannot run this test binary ({} is not world-executable)",
            dir.display()
        );
        return;
    }
    let p = process(json!({"name": "p", "exec": "/bin/sleep", "args": ["60"]}));
    let sup = start(config(vec![p], Some("rtctl")), Hooks::default());
    let meta = std::fs::metadata(&sup.socket).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((meta.mode() & 0o777, meta.gid()), (0o660, 4242));

    // nobody, not in the group: the socket file's mode refuses it.
    let out = as_user(&sup.socket, 65534, 65534);
    assert!(
        out.starts_with("HELPER-ERROR cannot connect to") && out.contains("Permission denied"),
        "{out}"
    );

    // nobody with the robot's group: allowed.
    let out = as_user(&sup.socket, 65534, 4242);
    assert!(out.starts_with("HELPER-REPLY {\"ok\":true"), "{out}");

    // With the mode loosened by hand, the peer check still refuses.
    std::fs::set_permissions(&sup.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = as_user(&sup.socket, 65534, 65534);
    assert!(
        out.contains("permission denied: uid 65534 is not root, not the supervisor's user (0) and not in group `rtctl` (4242)"),
        "{out}"
    );
    // Root is always allowed.
    assert!(sup.request(&Request::Status).ok);
    sup.stop_all();
}
