//! A daemon that will not quit: leftovers get SIGTERM then SIGKILL. One the
//! user's own process never reaps ends as a zombie: it holds nothing, so it
//! is reported, not a reason to drain (audit item M3: a user must not be able
//! to drain nodes by tampering with their own daemon). Only a process that
//! survives SIGKILL (stuck in the kernel) drains, with `gpu-mode: MPS zombie
//! pid <p> (job <j>, GPU <uuid>)`; that needs a stuck driver, so it is
//! covered by the unit tests of `still_present` and `dismantle`'s reason.
//! Its own cluster: the misbehaviour is set for every daemon of the cluster.

use gpu_mode_tests::shared::cluster;
use std::time::Duration;

#[test]
fn a_daemon_that_ignores_quit_is_killed_and_one_that_survives_drains_the_node() {
    let c = cluster("mps_zombie", 1);

    // Ignores quit, dies on SIGTERM: cleaned up, no drain.
    c.set_mps_behaviour("quit = \"ignore\"\n").unwrap();
    let job = c.sbatch_wait(Some("gmtest1"), &["--gpu-mode=mps", "--gres=gpu:1"], "#!/bin/sh\ntrue\n").unwrap();
    assert_eq!(job.exit_code, 0, "{}", job.output);
    let epilog = wait_for(|| c.hook_log_lines(job.id).into_iter().find(|l| l.contains("action=epilog")));
    assert!(epilog.contains("ignored quit; signalled pids") && epilog.contains("outcome=ok"), "{epilog}");
    assert!(!c.node_state().unwrap().0.contains("DRAIN"));

    // Ignores quit and SIGTERM, and its parent (the user's own process)
    // never reaps it: after SIGKILL it stays defunct. Not a node fault.
    c.set_mps_behaviour("quit = \"ignore\"\non_sigterm = \"ignore\"\nunreaped = true\n").unwrap();
    let job = c.sbatch_wait(Some("gmtest1"), &["--gpu-mode=mps", "--gres=gpu:1"], "#!/bin/sh\ntrue\n").unwrap();
    assert_eq!(job.exit_code, 0, "{}", job.output);
    let epilog = wait_for(|| c.hook_log_lines(job.id).into_iter().find(|l| l.contains("action=epilog")));
    assert!(epilog.contains("outcome=ok") && epilog.contains("unreaped zombies"), "{epilog}");
    assert!(epilog.contains("left to their parents"), "{epilog}");
    let (state, reason) = c.node_state().unwrap();
    assert!(!state.contains("DRAIN"), "state {state} reason {reason}\n{}", c.logs_tail());
}

fn wait_for<T>(mut f: impl FnMut() -> Option<T>) -> T {
    for _ in 0..300 {
        if let Some(v) = f() {
            return v;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out");
}
