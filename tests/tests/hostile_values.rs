//! Threat-model boundaries (docs/security.md): a mode value is user text
//! that reaches the root prolog and epilog. Shell syntax, newlines and
//! forged log fields in it are refused at submit by the plugin, and when
//! they bypass the plugin (a submit host without it: the value arrives in
//! SPANK_GPU_MODE as slurmd passes it) the root hooks parse it again, refuse
//! the job without draining, never run it, and log it as one escaped value.

use gpu_mode_tests::shared::cluster;
use gpu_mode_tests::Cluster;

fn c() -> &'static Cluster {
    cluster("hostile_values", 1)
}

/// A file each value would create if any part of it reached a shell.
fn mark() -> std::path::PathBuf {
    c().dir.join("out/pwned")
}

fn hostile() -> Vec<String> {
    let m = mark().display().to_string();
    vec![
        format!("mps;touch {m}"),
        format!("mps$(touch {m})"),
        format!("mps`touch {m}`"),
        format!("mps\ntouch {m}"),
        format!("mig:@$(touch {m})"),
        format!("mps:threads=5;touch {m}"),
        format!("checkpoint && touch {m}"),
        format!("mps|touch {m}"),
        format!("'; touch {m}; '"),
        // A forged log field and a forged second log line.
        "mps\" outcome=ok detail=\"forged".to_string(),
        "mps\ngpu-mode: action=prolog job=1 outcome=ok".to_string(),
        format!("mps:mem=1G\r\n{}", "x".repeat(600)),
    ]
}

fn hook_log() -> String {
    std::fs::read_to_string(c().dir.join("log/hooks.log")).unwrap_or_default()
}

#[test]
fn hostile_values_that_bypass_the_plugin_are_refused_by_the_root_hooks_without_a_shell_or_a_drain() {
    let values = hostile();
    for (i, value) in values.iter().enumerate() {
        let job = 9100 + i as u32;
        let before = hook_log().lines().count();
        let out = c().run_hook("prolog", job, "gmtest1", "0", value).unwrap();
        assert_eq!(out.status.code(), Some(0), "{value:?}: a refusal is not a node fault: {}", String::from_utf8_lossy(&out.stderr));
        let state = gpu_mode_core::state::JobState::load(&c().runtime_dir(), job).unwrap();
        let refusal = state.refusal.clone().unwrap_or_else(|| panic!("{value:?} was accepted"));
        assert!(refusal.contains("invalid --gpu-mode value"), "{value:?}: {refusal}");
        assert!(state.mode.len() <= 512 && state.task_env.is_empty() && state.gpus.is_empty(), "{state:?}");
        // One log line per hook run, the value escaped inside it.
        let log = hook_log();
        let new: Vec<&str> = log.lines().skip(before).collect();
        assert_eq!(new.len(), 1, "{value:?} split the log line: {new:#?}");
        assert!(new[0].contains(&format!(" job={job} ")) && new[0].ends_with("outcome=refused"), "{value:?}: {}", new[0]);
        let out = c().run_hook("epilog", job, "gmtest1", "0", value).unwrap();
        assert_eq!(out.status.code(), Some(0), "{value:?} epilog: {}", String::from_utf8_lossy(&out.stderr));
        assert!(!gpu_mode_core::state::JobState::is_live(&c().runtime_dir(), job));
    }
    assert!(!mark().exists(), "a value reached a shell");
    let (state, reason) = c().node_state().unwrap();
    assert!(!state.contains("DRAIN"), "hostile values drained the node: {state} {reason}");
}

#[test]
fn hostile_values_are_refused_at_submit_in_one_escaped_line() {
    let var = "SLURM_SPANK__SLURM_SPANK_OPTION_gpu_mode_gpu_mode";
    for value in hostile() {
        let arg = format!("--gpu-mode={value}");
        for (how, out) in [
            ("option", c().client("sbatch", &["--parsable", &arg, "--wrap", "true"]).run_as(Some("gmtest2")).unwrap()),
            ("environment", c().client("sbatch", &["--parsable", "--wrap", "true"]).env(var, &value).run_as(Some("gmtest2")).unwrap()),
        ] {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success() && out.stdout.is_empty(), "{how} {value:?} was queued");
            let ours: Vec<&str> = stderr.lines().filter(|l| l.contains("gpu-mode")).collect();
            assert_eq!(ours.len(), 1, "{how} {value:?}: one line: {stderr}");
            assert!(ours[0].contains("invalid --gpu-mode value \"") && !ours[0].contains('\r'), "{how} {value:?}: {stderr}");
        }
    }
    assert!(!mark().exists(), "a value reached a shell");
}

/// Threat-model boundary: /tmp/nvidia-mps, MPS's default pipe directory,
/// planted by another user (here a symlink of gmtest2's) is never used or
/// touched by root: an MPS job's daemon and tasks use the job's own
/// directory under the runtime directory.
#[test]
fn a_planted_default_mps_pipe_directory_is_never_used_or_touched() {
    use std::os::unix::fs::MetadataExt;
    let default = std::path::Path::new("/tmp/nvidia-mps");
    let planted = std::fs::symlink_metadata(default).is_err();
    if planted {
        let u = gpu_mode_tests::users::lookup("gmtest2").unwrap();
        std::os::unix::fs::symlink(c().dir.join("out"), default).unwrap();
        std::os::unix::fs::lchown(default, Some(u.uid), Some(u.gid)).unwrap();
    }
    let before = std::fs::symlink_metadata(default).unwrap();
    let job = c().sbatch_wait(Some("gmtest1"), &["--gpu-mode=mps", "--gres=gpu:1"], "#!/bin/sh\necho pipe=$CUDA_MPS_PIPE_DIRECTORY\n");
    let after = std::fs::symlink_metadata(default).unwrap();
    if planted {
        std::fs::remove_file(default).unwrap();
    }
    let job = job.unwrap();
    assert_eq!(job.exit_code, 0, "{}", job.output);
    let pipe = job.output.trim().strip_prefix("pipe=").unwrap_or_default().to_string();
    assert!(pipe.starts_with(&c().runtime_dir().join("mps").display().to_string()), "the job's pipe directory: {pipe:?}");
    let same = |m: &std::fs::Metadata| (m.uid(), m.gid(), m.mode(), m.ino(), m.ctime(), m.ctime_nsec());
    assert_eq!(same(&before), same(&after), "root changed the planted /tmp/nvidia-mps");
}
