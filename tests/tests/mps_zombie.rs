//! A daemon that will not quit: leftovers get SIGTERM then SIGKILL, and a
//! survivor drains the node with `gpu-mode: MPS zombie pid <p> (job <j>, GPU <uuid>)`.
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

    // Ignores quit and SIGTERM, and its parent never reaps it: after SIGKILL
    // it stays defunct, a survivor.
    c.set_mps_behaviour("quit = \"ignore\"\non_sigterm = \"ignore\"\nunreaped = true\n").unwrap();
    let job = c.sbatch_wait(Some("gmtest1"), &["--gpu-mode=mps", "--gres=gpu:1"], "#!/bin/sh\ntrue\n").unwrap();
    let (state, reason) = wait_for(|| {
        let (s, r) = c.node_state().unwrap();
        s.contains("DRAIN").then_some((s, r))
    });
    assert!(state.contains("DRAIN"));
    let prefix = "gpu-mode: MPS zombie pid ";
    assert!(reason.starts_with(prefix), "reason {reason:?}\n{}", c.logs_tail());
    let rest = &reason[prefix.len()..];
    let pid: u32 = rest.split_whitespace().next().unwrap().parse().expect("a pid");
    assert!(pid > 1);
    assert!(rest.contains(&format!("(job {}, GPU GPU-", job.id)), "{reason}");
    c.resume_node().unwrap();
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
