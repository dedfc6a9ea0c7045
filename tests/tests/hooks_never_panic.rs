//! Low audit item: a hook whose stderr is a closed pipe (slurmd gone, or a
//! reader that stopped) must still finish with its own exit code. Before the
//! fix, `eprintln!` panicked on EPIPE: exit 101, a "Prolog error" drain.

use gpu_mode_tests::Artifacts;
use std::process::{Command, Stdio};

#[test]
fn a_closed_stderr_never_turns_into_a_panic() {
    let a = Artifacts::locate().unwrap();
    for hook in [&a.prolog, &a.epilog] {
        let (read, write) = nix::unistd::pipe().unwrap();
        drop(read);
        // No job environment: the hook reports that on stderr and exits 2.
        let status = Command::new(hook)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(write))
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(2), "{}: {status}", hook.display());
    }
}
