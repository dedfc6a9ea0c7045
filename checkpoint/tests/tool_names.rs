//! The CUDA checkpoint tool answers to `gpu-mode-cuda-ckpt`, and to its old
//! name `gpu-mode-checkpoint` for one release: the same program, which says
//! on stderr that the name goes.

use std::process::Command;

fn help(exe: &str) -> (i32, String, String) {
    let out = Command::new(exe).arg("--help").output().expect("running the tool");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

#[test]
fn the_old_name_runs_the_same_tool_and_says_it_goes() {
    let (code, stdout, stderr) = help(env!("CARGO_BIN_EXE_gpu-mode-cuda-ckpt"));
    assert_eq!((code, stderr.as_str()), (0, ""), "{stdout}");
    assert!(stdout.contains("Usage: gpu-mode-cuda-ckpt") && stdout.contains("checkpoint") && stdout.contains("restore"), "{stdout}");
    let (old_code, old_stdout, old_stderr) = help(env!("CARGO_BIN_EXE_gpu-mode-checkpoint"));
    // The same help; clap's usage line names the program as it was called.
    assert_eq!((old_code, old_stdout.replace("Usage: gpu-mode-checkpoint", "Usage: gpu-mode-cuda-ckpt")), (0, stdout.clone()));
    assert_eq!(
        old_stderr.trim(),
        "gpu-mode-checkpoint: warning: this tool is now gpu-mode-cuda-ckpt; the old name goes in a later release"
    );
}
