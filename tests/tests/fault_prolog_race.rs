//! Fault matrix (docs/faults.md): two prologs racing for the same GPU
//! (Slurm gives gres/gpu jobs their own GPUs, but sharing set-ups such as
//! gres/shard or oversubscription do not, and a requeue can overlap an
//! epilog). The real hooks are started at the same moment, as slurmd would,
//! over several rounds: the per-GPU locks serialise them, each pair ends in
//! a defined outcome (shared, or one refused), never a drain or a deadlock,
//! and both epilogs leave nothing.

use gpu_mode_core::modes::GrantRecord;
use gpu_mode_core::state::JobState;
use gpu_mode_tests::shared::cluster;
use gpu_mode_tests::Cluster;
use std::sync::{Barrier, Mutex};

static TURN: Mutex<()> = Mutex::new(());
const ROUNDS: u32 = 5;

fn c() -> &'static Cluster {
    cluster("fault_prolog_race", 1)
}

/// Runs `hook` for both jobs at once; both must exit 0.
fn both(hook: &str, a: (u32, &'static str, &'static str), b: (u32, &'static str, &'static str)) {
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        let handles: Vec<_> = [a, b]
            .into_iter()
            .map(|(job, user, mode)| {
                let barrier = &barrier;
                let h = s.spawn(move || {
                    barrier.wait();
                    c().run_hook(hook, job, user, "0", mode).unwrap()
                });
                (job, h)
            })
            .collect();
        for (job, h) in handles {
            let out = h.join().unwrap();
            assert_eq!(out.status.code(), Some(0), "{hook} of job {job}: {}", String::from_utf8_lossy(&out.stderr));
        }
    });
}

fn state(job: u32) -> JobState {
    JobState::load(&c().runtime_dir(), job).unwrap()
}

fn assert_clean(what: &str) {
    let left = c().leftovers(None);
    assert!(left.is_clean(), "{what}: left behind:\n{}", left.summary());
    let (node, reason) = c().node_state().unwrap();
    assert!(!node.contains("DRAIN"), "{what}: {node} {reason}");
}

#[test]
fn two_users_racing_for_one_gpu_with_mps_one_gets_it_the_other_is_refused() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    for round in 0..ROUNDS {
        let (a, b) = (7000 + 2 * round, 7001 + 2 * round);
        both("prolog", (a, "gmtest1", "mps"), (b, "gmtest2", "mps"));
        let (sa, sb) = (state(a), state(b));
        let winners = [&sa, &sb].iter().filter(|s| matches!(s.grant, GrantRecord::Mps { .. })).count();
        let refused: Vec<&String> = [&sa, &sb].iter().filter_map(|s| s.refusal.as_ref()).collect();
        assert_eq!((winners, refused.len()), (1, 1), "round {round}: {sa:?} {sb:?}");
        assert!(refused[0].contains("another user's MPS daemon"), "round {round}: {}", refused[0]);
        both("epilog", (a, "gmtest1", "mps"), (b, "gmtest2", "mps"));
        assert_clean(&format!("mps two users, round {round}"));
    }
}

#[test]
fn one_users_racing_jobs_share_one_daemon() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    for round in 0..ROUNDS {
        let (a, b) = (7100 + 2 * round, 7101 + 2 * round);
        both("prolog", (a, "gmtest1", "mps:threads=40"), (b, "gmtest1", "mps"));
        let (sa, sb) = (state(a), state(b));
        assert!(matches!(sa.grant, GrantRecord::Mps { .. }) && sa.grant == sb.grant, "round {round}: {sa:?} {sb:?}");
        let daemons = gpu_mode_core::mps::DaemonRecord::all(&c().runtime_dir()).unwrap();
        assert_eq!(daemons.len(), 1, "round {round}");
        let mut jobs = daemons[0].jobs.clone();
        jobs.sort();
        assert_eq!(jobs, vec![a, b], "round {round}");
        both("epilog", (a, "gmtest1", "mps"), (b, "gmtest1", "mps"));
        assert_clean(&format!("mps one user, round {round}"));
    }
}

#[test]
fn racing_mig_jobs_get_disjoint_instances_or_one_is_refused() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    for round in 0..ROUNDS {
        // Two 3g.71gb fit an H200 (placements 0 and 4); two 4g.71gb do not.
        for (mode, both_fit) in [("mig:3g.71gb", true), ("mig:4g.71gb", false)] {
            let (a, b) = (7200 + 4 * round + 2 * both_fit as u32, 7201 + 4 * round + 2 * both_fit as u32);
            both("prolog", (a, "gmtest1", mode), (b, "gmtest2", mode));
            let (sa, sb) = (state(a), state(b));
            let placements = |s: &JobState| match &s.grant {
                GrantRecord::Mig(g) => g.gpus.iter().flat_map(|g| g.instances.iter().map(|i| i.placement_start)).collect::<Vec<_>>(),
                _ => vec![],
            };
            let (pa, pb) = (placements(&sa), placements(&sb));
            if both_fit {
                assert_eq!((pa.len(), pb.len()), (1, 1), "round {round} {mode}: {sa:?} {sb:?}");
                assert_ne!(pa, pb, "round {round} {mode}: one placement given twice");
            } else {
                let refused = [&sa, &sb].iter().filter(|s| s.refusal.is_some()).count();
                assert_eq!((pa.len() + pb.len(), refused), (1, 1), "round {round} {mode}: {sa:?} {sb:?}");
            }
            both("epilog", (a, "gmtest1", mode), (b, "gmtest2", mode));
            assert_clean(&format!("{mode}, round {round}"));
        }
    }
}
