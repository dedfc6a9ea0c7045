//! Issue 27 F2 and F5 on a real Slurm: the job's user controls its name,
//! comment and working directory, which `scontrol show job` prints raw
//! ahead of AdminComment and JobState. With newlines and `AdminComment=` /
//! `JobState=` text in all three, the agent's accounting read (as root)
//! still finds the site's AdminComment, the image sweep's "has the job
//! ended" and gpu-mode-run's state read still find the job's own state.

use gpu_mode_core::drain::Scontrol;
use gpu_mode_core::preempt::accounting::{self, AccountingField, Event, EventKind};
use gpu_mode_core::preempt::slurm_view::SlurmView;
use gpu_mode_tests::ckpt_jobs::admin_comment;
use gpu_mode_tests::shared::cluster;
use gpu_mode_tests::Cluster;
use std::time::{Duration, Instant};

fn c() -> &'static Cluster {
    cluster("hostile_job_fields", 1)
}

const FORGED: &str = "AdminComment=billing=free JobState=PENDING";

/// A held job of a test user whose name, comment and working directory
/// each hold a newline and [`FORGED`].
fn hostile_job(c: &Cluster) -> u32 {
    let dir = c.dir.join(format!("out/wd\n{FORGED}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let name = format!("--job-name=x JobState=PENDING\n{FORGED}");
    let comment = format!("--comment=c\n{FORGED}");
    let chdir = format!("--chdir={}", dir.display());
    c.sbatch(Some("gmtest1"), &["--hold", &name, &comment, &chdir], "#!/bin/sh\nsleep 600\n").unwrap()
}

fn event() -> Event {
    Event { kind: EventKind::Checkpoint, run: 0, node: "n1".into(), seconds: 1.0, image_bytes: Some(1 << 20) }
}

#[test]
fn the_users_fields_are_never_read_as_the_admin_comment_or_the_job_state() {
    let c = c();
    // gpu-mode-core's Scontrol runs the install's scontrol and squeue with
    // this process's environment, as the agent and the epilog run them.
    std::env::set_var("SLURM_CONF", c.dir.join("slurm.conf"));
    for (k, v) in c.install.client_env() {
        std::env::set_var(k, v);
    }
    let scontrol = Scontrol::new(&c.install.bin("scontrol"));

    // No AdminComment yet: the section alone.
    let job = hostile_job(c);
    let shown = c.job_info(job).unwrap().raw;
    assert!(shown.contains(&format!("\n{FORGED}")), "the forged line reaches scontrol show job:\n{shown}");
    accounting::record(&scontrol, AccountingField::AdminComment, job, &event()).unwrap();
    assert_eq!(admin_comment(c, job), "gpu-mode{ckpt=r0@n1:1.0s/1MiB}");

    // The site's text is kept, never replaced by the user's.
    let site = c.client("scontrol", &["update", &format!("JobId={job}"), "AdminComment=site ticket 42"]).run_as_root().unwrap();
    assert!(site.status.success(), "{}", String::from_utf8_lossy(&site.stderr));
    accounting::record(&scontrol, AccountingField::AdminComment, job, &event()).unwrap();
    assert_eq!(admin_comment(c, job), "site ticket 42 gpu-mode{ckpt=r0@n1:1.0s/1MiB}");

    // gpu-mode-run's reads (issue 27 item 2): the state squeue gives, no
    // preemption, and no node left to move the job to on this one-node cluster.
    let view = SlurmView::new(&c.install.bin("scontrol"));
    let state = view.job_state(job).expect("squeue's state and preempt time");
    assert_eq!((state.state.as_str(), state.being_preempted), ("PENDING", false));
    let node = &c.spec.node_name;
    let moved = view.exclusion_with(job, node).unwrap_err();
    assert_eq!(moved.to_string(), format!("every node of partition debug ({node}) would be excluded"));

    // Held, the job has not ended; cancelled, it has, whatever its name says.
    assert!(!scontrol.job_has_ended(job).unwrap(), "a held job has not ended");
    let cancel = c.client("scancel", &[&job.to_string()]).run_as_root().unwrap();
    assert!(cancel.status.success(), "{}", String::from_utf8_lossy(&cancel.stderr));
    let until = Instant::now() + Duration::from_secs(30);
    while !scontrol.job_has_ended(job).unwrap() {
        assert!(Instant::now() < until, "the cancelled job named `x JobState=PENDING` never ended:\n{}", c.job_info(job).unwrap().raw);
        std::thread::sleep(Duration::from_millis(200));
    }
    // Slurm never knew this one: ended.
    assert!(scontrol.job_has_ended(job + 100_000).unwrap());
}
