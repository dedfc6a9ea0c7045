//! The project's CRIU patches (packaging/criu/*.patch) as the product
//! expects them, and the `PATCHES` file scripts/install-criu.sh writes next
//! to the install (`<prefix>/PATCHES`, `sha256sum` lines: hash, two
//! spaces, name). The node checker compares the two: a CRIU built without
//! exactly these patches dumps and restores without the project's fixes
//! (the page readers, the pre-resume hold, the creds refusal, the buffer
//! mapped from the image).

use std::path::{Path, PathBuf};

/// (SHA-256, file name) of every packaging/criu/*.patch, in name order: what
/// install-criu.sh's `expected_patches` prints. A test keeps it equal to the
/// directory, so a new or changed patch changes this list in the same commit.
pub const EXPECTED: &[(&str, &str)] = &[
    ("507627da980c6ce1093e5d9487bd523505fdb723a3fc2ee0fa6254bc901378c9", "0001-restorer-skip-capabilities-already-absent-from-bset.patch"),
    ("0f4aab5c7c5b002eb9837e5a8dcd3bccd82cf064d02c12108637c9f2dd1b6668", "0002-sockets-restrict-so-passcred-and-so-passsec-to-supported-families.patch"),
    ("9daf50994ba39de07e6dc59890cac2ecc159efccc425f96b2e90a786698a9eec", "0003-restore-apply-madv-hugepage-before-reading-pages.patch"),
    ("e950f233fe1a4cc4e96517033276d92d2d56017b55df8544a9491ff291bd2213", "0004-restorer-read-large-private-mappings-with-several-threads.patch"),
    ("80ca8d0e5dda5b8e1c902fe8760d5ca7bece08b7b5d80a2ff2bfada2cb1b3495", "0005-restore-refuse-unprivileged-creds-beyond-criu-s-own.patch"),
    ("2413e0fdf28fb9038faec9ca83fe31b7fac7645386ca27e568b5d6682474213e", "0006-restore-a-failed-pre-resume-script-aborts-the-restore.patch"),
    ("4034d18d437a26bdd3fc0e4aafd77977fd2207f9c99528a0d2dda5b1f93d05ab", "0007-restore-map-a-large-mapping-advised-sequential-from-the-pages-image.patch"),
];

/// The PATCHES file of the CRIU at `binary`: `<prefix>/bin/criu` →
/// `<prefix>/PATCHES`, the link (`/usr/local/sbin/criu`) followed first.
pub fn patches_file(binary: &Path) -> PathBuf {
    let real = std::fs::canonicalize(binary).unwrap_or_else(|_| binary.to_path_buf());
    real.parent().and_then(Path::parent).unwrap_or(Path::new("/")).join("PATCHES")
}

/// How an installed PATCHES list differs from [`EXPECTED`]: `None` when it
/// is the same set (blank lines and spacing aside).
pub fn difference(installed: &str) -> Option<String> {
    let have: Vec<(String, String)> = installed
        .lines()
        .filter_map(|l| l.split_once(char::is_whitespace).map(|(h, n)| (h.trim().to_string(), n.trim().to_string())))
        .collect();
    let missing: Vec<&str> = EXPECTED.iter().filter(|(h, n)| !have.iter().any(|(hh, hn)| hh == h && hn == n)).map(|(_, n)| *n).collect();
    let extra: Vec<&str> = have.iter().filter(|(h, n)| !EXPECTED.iter().any(|(eh, en)| eh == h && en == n)).map(|(_, n)| n.as_str()).collect();
    if missing.is_empty() && extra.is_empty() {
        return None;
    }
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!("missing or changed: {}", missing.join(", ")));
    }
    if !extra.is_empty() {
        parts.push(format!("not ours: {}", extra.join(", ")));
    }
    Some(parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list is packaging/criu/ as it is: names and `sha256sum`'s hashes.
    #[test]
    fn the_expected_list_is_the_packaging_directory() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/criu");
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".patch"))
            .collect();
        names.sort();
        let out = std::process::Command::new("/usr/bin/sha256sum").args(&names).current_dir(&dir).output().unwrap();
        assert!(out.status.success(), "sha256sum: {}", String::from_utf8_lossy(&out.stderr));
        let listed: String = EXPECTED.iter().map(|(h, n)| format!("{h}  {n}\n")).collect();
        assert_eq!(String::from_utf8_lossy(&out.stdout), listed, "packaging/criu changed: update criu::patches::EXPECTED");
    }

    #[test]
    fn an_installed_list_is_compared_as_a_set() {
        let ours: String = EXPECTED.iter().map(|(h, n)| format!("{h}  {n}\n")).collect();
        let (h1, n1) = EXPECTED[0];
        let cases: Vec<(String, Option<String>)> = vec![
            (ours.clone(), None),
            (format!("\n{ours}\n"), None),
            (ours.replacen(h1, &"0".repeat(64), 1), Some(format!("missing or changed: {n1}; not ours: {n1}"))),
            (ours.lines().skip(1).map(|l| format!("{l}\n")).collect(), Some(format!("missing or changed: {n1}"))),
            (format!("{ours}{}  9999-local.patch\n", "a".repeat(64)), Some("not ours: 9999-local.patch".into())),
        ];
        for (text, want) in cases {
            assert_eq!(difference(&text), want, "{text:?}");
        }
        assert!(difference("").unwrap().starts_with("missing or changed: 0001-"), "an empty list misses them all");
    }

    #[test]
    fn the_list_sits_beside_the_installs_bin() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("criu/bin")).unwrap();
        std::fs::write(dir.path().join("criu/bin/criu"), "").unwrap();
        std::os::unix::fs::symlink(dir.path().join("criu/bin/criu"), dir.path().join("link")).unwrap();
        let real = std::fs::canonicalize(dir.path()).unwrap().join("criu/PATCHES");
        assert_eq!(patches_file(&dir.path().join("link")), real, "the link is followed");
        assert_eq!(patches_file(Path::new("/nonexistent/bin/criu")), PathBuf::from("/nonexistent/PATCHES"));
    }
}
