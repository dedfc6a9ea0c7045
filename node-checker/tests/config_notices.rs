//! `gpu-mode-node-checker check-config` on a site config that still has the
//! old `[checkpoint]` section: valid (it means what it meant), with one
//! warning that names the file and the new sections; none for a config
//! written with `[cuda_ckpt]` and `[preempt]`.

use std::path::Path;
use std::process::Command;

fn check_config(path: &Path) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-mode-node-checker"))
        .args(["check-config", "--config"])
        .arg(path)
        .output()
        .expect("running gpu-mode-node-checker");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

#[test]
fn the_old_checkpoint_section_is_valid_with_a_warning_and_the_new_ones_without() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("old.toml", "[checkpoint]\nlock_timeout_ms = 2500\nimage_dir = \"/shared/ckpt\"\n", true),
        ("new.toml", "[cuda_ckpt]\nlock_timeout_ms = 2500\n[preempt]\nimage_dir = \"/shared/ckpt\"\n", false),
    ];
    for (name, text, warned) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let (code, stdout, stderr) = check_config(&path);
        assert_eq!((code, stdout.trim()), (0, format!("{}: valid", path.display()).as_str()), "{name}: {stderr}");
        let warning = format!(
            "gpu-mode-node-checker: warning: {}: the [checkpoint] section is now [preempt], its lock_timeout_ms in [cuda_ckpt]",
            path.display()
        );
        assert_eq!(stderr.contains(&warning), warned, "{name}: {stderr}");
        assert_eq!(stderr.contains("warning"), warned, "{name}: {stderr}");
    }
    let path = dir.path().join("both.toml");
    std::fs::write(&path, "[checkpoint]\nimage_dir = \"/a\"\n[preempt]\nimage_dir = \"/b\"\n").unwrap();
    let (code, _, stderr) = check_config(&path);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("checkpoint.image_dir is now preempt.image_dir, which this file sets too: keep one"), "{stderr}");
}
