//! The checkpoint agent's events in Slurm's accounting database: a cluster
//! with slurmdbd and a private MariaDB (`ClusterSpec::accounting_db`) and the
//! preemption partitions of preempt_checkpoint.rs. A checkpoint job is
//! preempted, dumped, requeued, restored and completes; `sacct` then shows
//! one record per run, the requeued one holding the checkpoint event and
//! the last one the checkpoint and the restore (docs/checkpoint.md,
//! "Accounting").
//!
//! Needs root, CRIU 4 (scripts/install-criu.sh), slurmdbd and mariadb-server
//! (scripts/common.sh installs them) and `cargo build --workspace`; skipped
//! without them (said through the testkit) unless GPU_MODE_REQUIRE_CRIU=1 (CI).

use gpu_mode_tests::ckpt_jobs::*;
use gpu_mode_tests::shared::cluster_with;
use gpu_mode_tests::{AccountingDb, Cluster, Preemption};
use std::time::{Duration, Instant};

fn c() -> Option<&'static Cluster> {
    (criu_ready() && accounting_db_ready()).then(|| {
        cluster_with("preempt_accounting_db", 2, |s| {
            s.preemption = Some(Preemption::default());
            s.accounting_db = Some(AccountingDb::on_free_ports());
        })
    })
}

/// One accounting record of a job allocation (`sacct -X -D`): one per run.
#[derive(Debug)]
struct Record {
    state: String,
    admin_comment: String,
}

/// `sacct -j J -X -D -n -P -o JobID,State,AdminComment` as root: every run's
/// record (-D keeps the requeued ones), without the steps (-X).
fn sacct_records(c: &Cluster, job: u32) -> (Vec<Record>, String) {
    let args = ["-j", &job.to_string(), "-X", "-D", "-n", "-P", "-o", "JobID,State,AdminComment"].map(String::from);
    let out = c.client("sacct", &args.iter().map(String::as_str).collect::<Vec<_>>()).run_as_root().unwrap();
    assert!(out.status.success(), "sacct: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let records = text
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, '|');
            let (_id, state, comment) = (f.next()?, f.next()?, f.next()?);
            Some(Record { state: state.to_string(), admin_comment: comment.to_string() })
        })
        .collect();
    (records, text)
}

/// slurmctld sends a finished job's record to slurmdbd on its own time:
/// waits until the last record is final and holds the restore.
fn wait_final_records(c: &Cluster, job: u32) -> (Vec<Record>, String) {
    let start = Instant::now();
    loop {
        let (records, text) = sacct_records(c, job);
        let done = records.last().is_some_and(|r| r.state == "FAILED" && r.admin_comment.contains("restore="));
        if done || start.elapsed() > Duration::from_secs(60) {
            return (records, text);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn checkpoint_and_restore_events_are_in_sacct() {
    let Some(c) = c() else { return };
    let who = job_user();
    let (job, _ready) = start_counter(c, who, "acct", 5);
    let preemptor = submit_preemptor(c, None, None, 2, 3);
    wait_requeued(c, job, 1);
    assert_eq!(wait_finished(c, preemptor).get("ExitCode"), "0:0");
    let end = wait_finished(c, job);
    let out = c.job_output(job);
    assert_eq!((end.get("ExitCode"), end.restarts()), (format!("{EXIT}:0").as_str(), 1), "{out}");
    assert_counted_once(&out);

    let (records, text) = wait_final_records(c, job);
    eprintln!("sacct -j {job} -X -D -n -P -o JobID,State,AdminComment:\n{text}");
    // One record per run: the restarts are the requeued runs before the last.
    assert_eq!(records.len(), 2, "one record per run, Restarts=1:\n{text}");
    let node = &c.spec.node_name;
    let (requeued, last) = (&records[0], &records[1]);
    assert_eq!(requeued.state, "REQUEUED", "{text}");
    assert_eq!(events_in(&requeued.admin_comment), [format!("ckpt=r0@{node}")], "{text}");
    // Run 1 exits with the application's code: FAILED, as Slurm calls exit 7.
    assert_eq!(last.state, "FAILED", "{text}");
    assert_eq!(events_in(&last.admin_comment), [format!("ckpt=r0@{node}"), format!("restore=r1@{node}")], "{text}");
    // The database holds what slurmctld holds.
    assert_eq!(last.admin_comment, admin_comment(c, job));
    assert_images_removed(c, job);
}
