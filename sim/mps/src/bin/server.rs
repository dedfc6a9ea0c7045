//! Stand-in `nvidia-cuda-mps-server`: holds no GPU, just lives until its
//! control daemon goes away or it is told to stop (SIGTERM, SIGKILL).

use std::time::Duration;

fn main() {
    let parent = std::os::unix::process::parent_id();
    mps_sim::log("server.log", &format!("NEW SERVER pid {} started, uid {}", std::process::id(), unsafe { libc::getuid() }));
    // A real server exits when its daemon does; the parent changes when the
    // daemon exits (we are re-parented).
    while std::os::unix::process::parent_id() == parent {
        std::thread::sleep(Duration::from_millis(50));
    }
    mps_sim::log("server.log", "control daemon gone, server exiting");
}
