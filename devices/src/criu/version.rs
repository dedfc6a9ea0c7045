//! `criu --version` output: "Version: 4.1.1" (and maybe a GitID line).

/// The oldest major version accepted: 3.17 fails `criu check` on 6.x
/// kernels ("Unexpected rt vDSO area bounds", seen on the GPU machines).
pub const MIN_MAJOR: u32 = 4;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CriuVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl CriuVersion {
    /// Parses `criu --version`'s output; `None` when there is no version line.
    pub fn parse(output: &str) -> Option<CriuVersion> {
        let text = output.lines().find_map(|l| l.trim().strip_prefix("Version:"))?.trim();
        let mut nums = text.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()).map(|s| s.parse::<u32>());
        let major = nums.next()?.ok()?;
        let minor = nums.next().and_then(Result::ok).unwrap_or(0);
        let patch = nums.next().and_then(Result::ok).unwrap_or(0);
        Some(CriuVersion { major, minor, patch })
    }

    pub fn new_enough(&self) -> bool {
        self.major >= MIN_MAJOR
    }
}

impl std::fmt::Display for CriuVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_compare() {
        let cases = [
            ("Version: 4.1.1\n", Some((4, 1, 1)), true),
            ("Version: 3.17.1\nGitID: v3.17.1\n", Some((3, 17, 1)), false),
            ("Version: 4.0\n", Some((4, 0, 0)), true),
            ("criu: command not found", None, false),
        ];
        for (text, want, ok) in cases {
            let got = CriuVersion::parse(text);
            assert_eq!(got.as_ref().map(|v| (v.major, v.minor, v.patch)), want, "{text:?}");
            assert_eq!(got.is_some_and(|v| v.new_enough()), ok, "{text:?}");
        }
        assert_eq!(CriuVersion { major: 4, minor: 1, patch: 1 }.to_string(), "4.1.1");
    }
}
