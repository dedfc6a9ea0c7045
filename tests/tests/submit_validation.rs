//! `--gpu-mode` values are validated at submit time by the real plugin in
//! sbatch, srun and salloc: bad values fail before the job is queued, with a
//! message naming the offending part; good values are accepted.

use gpu_mode_tests::shared::cluster;
use std::time::Duration;

fn c() -> &'static gpu_mode_tests::Cluster {
    cluster("submit_validation", 2)
}

/// One bad value per class of the issue, with a fragment of its message.
const BAD: &[(&str, &str)] = &[
    ("gpu", "unknown mode \"gpu\""),
    ("", "the value is empty"),
    ("mig:1g10gb", "is not of the form <n>g.<m>gb"),
    ("mig:1g.10gbx0", "count 0 in \"1g.10gbx0\" is out of range"),
    ("mig:1g.10gbx8", "count 8 in \"1g.10gbx8\" is out of range"),
    ("mps:color=red", "unknown mps key \"color\""),
    ("mps:threads=5,threads=6", "key \"threads\" is given twice"),
    ("mps:threads=101", "threads=101 is out of range"),
    ("checkpoint:x", "parameter \"x\" is not key=value (keys: nccl, pool)"),
    ("checkpoint:nccl=fast", "nccl=fast is not a transport (nccl=portable or nccl=native)"),
    ("checkpoint:nccl=", "nccl= has no value"),
    ("checkpoint:nccl=portable,nccl=native", "key \"nccl\" is given twice"),
    ("checkpoint:pool=maybe", "pool=maybe is not a setting (pool=on or pool=off)"),
    ("checkpoint:pool=on,pool=off", "key \"pool\" is given twice"),
    ("mps:threads=5,", "empty parameter"),
    ("mps:threads=5×", "non-ASCII character"),
];

fn too_long() -> String {
    format!("mig:@{}", "a".repeat(260))
}

fn assert_rejected(tool: &str, out: &std::process::Output, value: &str, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{tool} accepted --gpu-mode={value:?}; stderr: {stderr}");
    assert!(stderr.contains(needle), "{tool} --gpu-mode={value:?}: stderr lacks {needle:?}:\n{stderr}");
    assert!(stderr.contains("valid forms: mps"), "{tool}: message must show the valid forms:\n{stderr}");
}

#[test]
fn sbatch_rejects_each_bad_value_class_before_queueing() {
    let long = too_long();
    let mut cases: Vec<(&str, &str)> = BAD.to_vec();
    cases.push((&long, "the limit is 256"));
    for (value, needle) in cases {
        let arg = format!("--gpu-mode={value}");
        let out = c().client("sbatch", &["--parsable", &arg, "--wrap", "true"]).run_as_root().unwrap();
        assert_rejected("sbatch", &out, value, needle);
        assert!(out.stdout.is_empty(), "sbatch printed a job id for {value:?}: the job was queued");
    }
}

#[test]
fn srun_and_salloc_reject_bad_values() {
    for (value, needle) in [BAD[0], BAD[3], BAD[7]] {
        let arg = format!("--gpu-mode={value}");
        let out = c().client("srun", &[&arg, "true"]).run_as_root().unwrap();
        assert_rejected("srun", &out, value, needle);
        let out = c().client("salloc", &[&arg, "true"]).run_as_root().unwrap();
        assert_rejected("salloc", &out, value, needle);
    }
}

#[test]
fn the_environment_form_of_the_option_is_validated_too() {
    let var = "SLURM_SPANK__SLURM_SPANK_OPTION_gpu_mode_gpu_mode";
    let out = c().client("sbatch", &["--parsable", "--wrap", "true"]).env(var, "mps:threads=0").run_as_root().unwrap();
    assert_rejected("sbatch (env)", &out, "mps:threads=0", "threads=0 is out of range");
    let out = c()
        .client("srun", &["--gres=gpu:1", "printenv", "SLURM_GPU_MODE"])
        .env(var, "mps:threads=7")
        .run_as_root()
        .unwrap();
    assert!(out.status.success(), "srun with the env form failed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "mps:threads=7");
}

#[test]
fn good_values_are_accepted_by_sbatch_srun_and_salloc() {
    // The simulated GPUs are H200s; real GPU machines forbid MIG changes, so
    // MIG jobs would be refused there (mig_mode = "leave").
    let mig: &[&str] = if c().spec.real_gpus { &[] } else { &["mig:1g.18gbx2,3g.71gb", "mig:@half"] };
    for value in ["mps", "mps:threads=25,mem=512M"].iter().chain(mig) {
        let arg = format!("--gpu-mode={value}");
        let job = c().sbatch_wait(None, &[&arg, "--gres=gpu:1"], "#!/bin/sh\necho ok\n").unwrap();
        assert_eq!(job.exit_code, 0, "sbatch --gpu-mode={value}: {}\n{}", job.output, c().logs_tail());
    }
    // A checkpoint job with the options preemption needs, on the command
    // line or in the script's #SBATCH lines.
    let job = c().sbatch_wait(None, &["--gpu-mode=checkpoint", "--signal=B:USR1@60", "--requeue", "--gres=gpu:1"], "#!/bin/sh\necho ok\n").unwrap();
    assert_eq!(job.exit_code, 0, "{}\n{}", job.output, c().logs_tail());
    let script = "#!/bin/sh\n#SBATCH --signal=B:USR1@90\n#SBATCH --requeue\necho ok\n";
    let job = c().sbatch_wait(None, &["--gpu-mode=checkpoint", "--gres=gpu:1"], script).unwrap();
    assert_eq!(job.exit_code, 0, "{}\n{}", job.output, c().logs_tail());
    // NCCL's transport and the host memory pool reach the tasks (gpu-mode-run
    // reads them there); the site's defaults here ("allow") leave a plain
    // checkpoint job native and without a pool.
    let env = "#!/bin/sh\necho nccl=$GPU_MODE_CKPT_NCCL pool=$GPU_MODE_TASK_POOL mode=$SLURM_GPU_MODE\n";
    for (value, want) in [
        ("checkpoint", "nccl=native pool= mode=checkpoint"),
        ("checkpoint:nccl=portable", "nccl=portable pool= mode=checkpoint:nccl=portable"),
        ("checkpoint:pool=on", "nccl=native pool=on mode=checkpoint:pool=on"),
        ("checkpoint:nccl=portable,pool=on", "nccl=portable pool=on mode=checkpoint:nccl=portable,pool=on"),
    ] {
        let arg = format!("--gpu-mode={value}");
        let job = c().sbatch_wait(None, &[&arg, "--signal=B:USR1@60", "--requeue", "--gres=gpu:1"], env).unwrap();
        assert_eq!((job.exit_code, job.output.trim()), (0, want), "{}", c().logs_tail());
    }
    let out = c()
        .client("srun", &["--gpu-mode=mps", "--gres=gpu:1", "true"])
        .timeout(Duration::from_secs(60))
        .run_as_root()
        .unwrap();
    assert!(out.status.success(), "srun: {}", String::from_utf8_lossy(&out.stderr));
    let out = c().client("salloc", &["--gpu-mode=mps", "--gres=gpu:1", "true"]).run_as_root().unwrap();
    assert!(out.status.success(), "salloc: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_checkpoint_job_slurm_would_not_requeue_or_signal_is_refused_with_the_line_to_use() {
    let out = c().client("sbatch", &["--parsable", "--gpu-mode=checkpoint", "--gres=gpu:1", "--wrap", "true"]).run_as(Some("gmtest1")).unwrap();
    assert!(!out.status.success(), "queued: {}", String::from_utf8_lossy(&out.stdout));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--gpu-mode=checkpoint") && stderr.contains("--requeue") && stderr.contains("--signal=B:USR1@"), "{stderr}");
    assert!(stderr.contains("Submit it as:") && stderr.contains("gpu-mode-run"), "{stderr}");
    // Interactive jobs cannot be requeued at all.
    let out = c().client("srun", &["--gpu-mode=checkpoint", "--gres=gpu:1", "true"]).run_as(Some("gmtest1")).unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs a batch job"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_non_root_user_gets_the_same_validation() {
    let out = c()
        .client("sbatch", &["--parsable", "--gpu-mode=mig:1g.10gbx9", "--wrap", "true"])
        .run_as(Some("gmtest1"))
        .unwrap();
    assert_rejected("sbatch as gmtest1", &out, "mig:1g.10gbx9", "count 9");
    let job = c().sbatch_wait(Some("gmtest1"), &["--gpu-mode=mps", "--gres=gpu:1"], "#!/bin/sh\nid -un\n").unwrap();
    assert_eq!(job.exit_code, 0, "{}\n{}", job.output, c().logs_tail());
    assert_eq!(job.output.trim(), "gmtest1");
}
