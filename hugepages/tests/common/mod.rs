//! What the preload library's integration tests share.

use std::path::PathBuf;

/// The library cargo built for this test: target/<profile>/deps/ (where
/// this test runs) or target/<profile>/.
pub fn built_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let candidates = [deps.join("libgpu_mode_hugepages.so"), deps.parent().unwrap().join("libgpu_mode_hugepages.so")];
    candidates.iter().find(|p| p.exists()).cloned().unwrap_or_else(|| panic!("libgpu_mode_hugepages.so not built: {candidates:?}"))
}
