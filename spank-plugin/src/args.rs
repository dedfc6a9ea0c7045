//! Plugin arguments from plugstack.conf:
//! `required gpu_mode.so [config=PATH] [runtime_dir=PATH]`. With
//! `runtime_dir=` the plugin never reads the site config (as pyxis takes its
//! settings from plugstack arguments).

use std::path::PathBuf;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PluginArgs {
    /// The site config file; `None` means the default path.
    pub config: Option<PathBuf>,
    /// Where the helpers keep job states; `None`: from the site config.
    pub runtime_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plugstack.conf arguments: {0} (known: config=<absolute path>, runtime_dir=<absolute path>)")]
pub struct ArgsError(pub String);

impl PluginArgs {
    pub fn parse(argv: &[&str]) -> Result<PluginArgs, ArgsError> {
        let mut out = PluginArgs::default();
        for arg in argv {
            let (key, value) = arg
                .split_once('=')
                .ok_or_else(|| ArgsError(format!("{arg:?} is not key=value")))?;
            let slot = match key {
                "config" => &mut out.config,
                "runtime_dir" => &mut out.runtime_dir,
                other => return Err(ArgsError(format!("unknown argument {other:?}"))),
            };
            if slot.is_some() {
                return Err(ArgsError(format!("{key}= is given twice")));
            }
            let path = PathBuf::from(value);
            if !path.is_absolute() || path.components().any(|c| c == std::path::Component::ParentDir) {
                return Err(ArgsError(format!("{key}={value:?} must be an absolute path without '..'")));
            }
            *slot = Some(path);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_arguments() {
        assert_eq!(PluginArgs::parse(&[]).unwrap(), PluginArgs::default());
        assert_eq!(
            PluginArgs::parse(&["config=/etc/g.toml"]).unwrap().config,
            Some(PathBuf::from("/etc/g.toml"))
        );
        assert_eq!(
            PluginArgs::parse(&["runtime_dir=/run/gm"]).unwrap().runtime_dir,
            Some(PathBuf::from("/run/gm"))
        );
    }

    #[test]
    fn invalid_arguments_name_the_problem() {
        for (argv, needle) in [
            (vec!["config"], "\"config\" is not key=value"),
            (vec!["config=rel.toml"], "must be an absolute path"),
            (vec!["runtime_dir=/run/../etc"], "without '..'"),
            (vec!["runtime_dir=/a", "runtime_dir=/b"], "runtime_dir= is given twice"),
            (vec!["config=/a", "config=/b"], "given twice"),
            (vec!["debug=1"], "unknown argument \"debug\""),
        ] {
            let err = PluginArgs::parse(&argv).unwrap_err().to_string();
            assert!(err.contains(needle), "{argv:?}: {err}");
            assert!(err.starts_with("plugstack.conf arguments:"), "{err}");
        }
    }
}
