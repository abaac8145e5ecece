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

/// Run by the test below as another user: one `status` request, the
/// outcome on stdout. On its own (`--include-ignored`) it does nothing.
#[test]
#[ignore = "helper process: run by control_socket_refuses_users_outside_the_group"]
fn client_helper() {
    let Ok(sock) = std::env::var(units::env::TEST_CLIENT_SOCKET) else {
        return;
    };
    match control::request(Path::new(&sock), &Request::Status) {
        Ok(r) => println!("HELPER-REPLY {}", serde_json::to_string(&r).unwrap()),
        Err(e) => println!("HELPER-ERROR {e}"),
    }
}

/// A copy of this test binary that every user may run (the clone it was
/// built in may be out of `nobody`'s reach), in a directory of its own.
fn reachable_copy() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("rtdeploy-helper-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.path().join("control_access");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, exe)
}

fn as_user(exe: &Path, socket: &Path, uid: u32, gid: u32) -> String {
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "client_helper",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(units::env::TEST_CLIENT_SOCKET, socket)
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
#[ignore = "needs root: running a client as user nobody (setuid)"]
fn control_socket_refuses_users_outside_the_group() {
    let (_dir, exe) = reachable_copy();
    let p = process(json!({"name": "p", "exec": "/bin/sleep", "args": ["60"]}));
    let sup = start(config(vec![p], Some("rtctl")), None);
    let meta = std::fs::metadata(&sup.socket).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((meta.mode() & 0o777, meta.gid()), (0o660, 4242));

    // nobody, not in the group: the socket file's mode refuses it.
    let out = as_user(&exe, &sup.socket, 65534, 65534);
    assert!(
        out.starts_with("HELPER-ERROR cannot connect to") && out.contains("Permission denied"),
        "{out}"
    );

    // nobody with the robot's group: allowed.
    let out = as_user(&exe, &sup.socket, 65534, 4242);
    assert!(out.starts_with("HELPER-REPLY {\"ok\":true"), "{out}");

    // With the mode loosened by hand, the peer check still refuses.
    std::fs::set_permissions(&sup.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = as_user(&exe, &sup.socket, 65534, 65534);
    assert!(
        out.contains("permission denied: uid 65534 is not root, not the supervisor's user (0) and not in group `rtctl` (4242)"),
        "{out}"
    );
    // Root is always allowed.
    assert!(sup.request(&Request::Status).ok);
    sup.stop_all();
}
