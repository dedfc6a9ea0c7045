//! Generates the SPANK bindings from the installed `<slurm/spank.h>` and takes
//! the Slurm version from `<slurm/slurm_version.h>`, so one source tree builds
//! for whichever Slurm (22.05 through 26.05) the build host has: the plugin's
//! `plugin_version` must match the loading Slurm's major.minor.
//!
//! `SLURM_INCLUDE_DIR` points at another Slurm's headers (a site's
//! /opt/slurm/include, or a Debian trixie root's /usr/include in CI); the
//! default is the compiler's search path (/usr/include: libslurm-dev on
//! Debian, slurm-devel on RHEL).

use std::env;
use std::path::PathBuf;

/// Only what the plugin calls: the rest of spank.h (and the callback
/// prototypes it declares `extern`, which the plugin itself defines) stays out.
const FUNCTIONS: &[&str] = &[
    "spank_context",
    "spank_option_register",
    "spank_get_item",
    "spank_getenv",
    "spank_setenv",
    "spank_job_control_setenv",
    "spank_strerror",
    "slurm_error",
    "slurm_verbose",
];

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-env-changed=SLURM_INCLUDE_DIR");
    let include = env::var_os("SLURM_INCLUDE_DIR").map(PathBuf::from);
    let search: Vec<PathBuf> = match &include {
        Some(dir) => vec![dir.clone()],
        None => vec![PathBuf::from("/usr/include"), PathBuf::from("/usr/local/include")],
    };
    let Some(dir) = search.iter().find(|d| d.join("slurm/spank.h").is_file()) else {
        let looked: Vec<String> = search.iter().map(|d| d.join("slurm/spank.h").display().to_string()).collect();
        panic!(
            "Slurm's SPANK header not found (looked for {}): install libslurm-dev (Debian/Ubuntu) or \
             slurm-devel (RHEL), or set SLURM_INCLUDE_DIR to the directory that holds slurm/spank.h",
            looked.join(", ")
        );
    };
    for h in ["slurm/spank.h", "slurm/slurm_version.h"] {
        println!("cargo:rerun-if-changed={}", dir.join(h).display());
    }
    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_arg(format!("-I{}", dir.display()))
        .allowlist_type("spank_t")
        .allowlist_type("spank_err_t")
        .allowlist_type("spank_context_t")
        .allowlist_type("spank_item_t")
        .allowlist_type("spank_option")
        .allowlist_var("SLURM_VERSION_NUMBER")
        .allowlist_var("ESPANK_.*")
        .allowlist_var("S_CTX_.*")
        .allowlist_var("S_JOB_ID")
        .prepend_enum_name(false)
        .layout_tests(false);
    for f in FUNCTIONS {
        builder = builder.allowlist_function(f);
    }
    let bindings = builder.generate().unwrap_or_else(|e| {
        panic!("generating SPANK bindings from {}/slurm/spank.h failed: {e} (is libclang-dev installed?)", dir.display())
    });
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings.write_to_file(out.join("spank_sys.rs")).expect("writing the SPANK bindings");
}
