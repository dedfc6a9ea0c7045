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

/// The `SLURM_VERSION_NUMBER` of the header the build read (build.rs: the
/// `SLURM_INCLUDE_DIR` it was given, else the first of /usr/include and
/// /usr/local/include that has Slurm's headers), read as text.
fn header_version_number() -> u32 {
    let dirs: Vec<PathBuf> = match std::env::var_os("SLURM_INCLUDE_DIR") {
        Some(dir) => vec![PathBuf::from(dir)],
        None => vec![PathBuf::from("/usr/include"), PathBuf::from("/usr/local/include")],
    };
    let dir = dirs.iter().find(|d| d.join("slurm/spank.h").is_file()).expect("Slurm's headers, as build.rs found them");
    let header = std::fs::read_to_string(dir.join("slurm/slurm_version.h")).unwrap();
    let hex = header
        .lines()
        .find_map(|l| l.strip_prefix("#define SLURM_VERSION_NUMBER 0x"))
        .unwrap_or_else(|| panic!("no SLURM_VERSION_NUMBER in {}/slurm/slurm_version.h", dir.display()));
    u32::from_str_radix(hex.trim(), 16).unwrap()
}

/// The 4-byte little-endian value of the exported data symbol `name` in
/// `so`, as the loader reads it: its address from `nm`, its bytes from
/// `objdump`.
fn exported_u32(so: &std::path::Path, name: &str) -> u32 {
    let nm = Command::new("nm").args(["-D", "--defined-only", "-S"]).arg(so).output().expect("running nm (binutils)");
    let text = String::from_utf8_lossy(&nm.stdout);
    // "0000000000012340 0000000000000004 R plugin_version"
    let fields = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() == 4 && f[3] == name)
        .unwrap_or_else(|| panic!("{name} not in nm's output:\n{text}"));
    let (addr, size) = (u64::from_str_radix(fields[0], 16).unwrap(), u64::from_str_radix(fields[1], 16).unwrap());
    assert_eq!(size, 4, "{name} is {size} bytes, not a C unsigned int");
    let dump = Command::new("objdump")
        .arg("-s")
        .arg(format!("--start-address={addr:#x}"))
        .arg(format!("--stop-address={:#x}", addr + 4))
        .arg(so)
        .output()
        .expect("running objdump (binutils)");
    let text = String::from_utf8_lossy(&dump.stdout);
    // " 1a2b0 08051600   ....": the line after "Contents of section".
    let word = text.lines().skip_while(|l| !l.starts_with("Contents of section")).nth(1).and_then(|l| l.split_whitespace().nth(1));
    let word = word.unwrap_or_else(|| panic!("no bytes of {name} in objdump's output:\n{text}"));
    let bytes: Vec<u8> = (0..word.len()).step_by(2).map(|i| u8::from_str_radix(&word[i..i + 2], 16).unwrap()).collect();
    u32::from_le_bytes(bytes.try_into().unwrap_or_else(|b| panic!("{name}: {b:?} is not 4 bytes")))
}

/// Slurm loads the plugin only when the `plugin_version` in the file is its
/// own `SLURM_VERSION_NUMBER`: the bytes in the built .so, not the Rust
/// constant, against the header as text (not through bindgen).
#[test]
fn the_exported_plugin_version_is_the_headers_slurm_version_number() {
    let want = header_version_number();
    assert_eq!(exported_u32(&built_plugin(), "plugin_version"), want, "plugin_version in the built plugin");
    let (major, minor, micro) = (want >> 16, (want >> 8) & 0xff, want & 0xff);
    assert_eq!(gpu_mode_spank::spank::built_for(), format!("{major}.{minor:02}.{micro}"));
}
