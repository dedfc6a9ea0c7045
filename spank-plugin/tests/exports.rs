//! What Slurm's loader sees in the built gpu_mode.so: the three plugin
//! symbols, the callbacks we implement, and never `init`/`fini` (Slurm would
//! call those as a generic plugin's). Read with `nm -D` from binutils.

use std::path::PathBuf;
use std::process::Command;

fn built_plugin() -> PathBuf {
    // Integration tests live in <target>/<profile>/deps/; the cdylib one up.
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let so = profile_dir.join("libgpu_mode_spank.so");
    assert!(so.is_file(), "{} is missing: build the plugin first", so.display());
    so
}

#[test]
fn the_plugin_exports_what_slurm_loads_and_nothing_named_init_or_fini() {
    let so = built_plugin();
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(&so).output().expect("running nm (binutils)");
    assert!(out.status.success(), "nm failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = text.lines().filter_map(|l| l.split_whitespace().nth(2)).filter(|n| !n.starts_with('_')).collect();
    for want in [
        "plugin_name",
        "plugin_type",
        "plugin_version",
        "slurm_spank_init",
        "slurm_spank_init_post_opt",
        "slurm_spank_task_init_privileged",
        "slurm_spank_task_init",
    ] {
        assert!(names.contains(&want), "{want} is not exported: {names:?}");
    }
    assert!(!names.iter().any(|n| *n == "init" || *n == "fini"), "init/fini exported: {names:?}");
    assert_eq!(names.len(), 7, "unexpected exports: {names:?}");
}

#[test]
fn plugin_version_is_the_installed_slurms() {
    assert_eq!(gpu_mode_spank::plugin_version, gpu_mode_spank::spank::SLURM_VERSION_NUMBER);
    let major_minor = gpu_mode_spank::plugin_version >> 8;
    assert!(major_minor >= 0x1605, "built for a Slurm older than 22.05: {}", gpu_mode_spank::spank::built_for());
}
