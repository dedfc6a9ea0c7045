//! Plugin arguments from plugstack.conf: `required gpu_mode.so [config=PATH]`.

use std::path::PathBuf;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PluginArgs {
    /// The site config file; `None` means the default path.
    pub config: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plugstack.conf arguments: {0} (known: config=<absolute path>)")]
pub struct ArgsError(pub String);

impl PluginArgs {
    pub fn parse(argv: &[&str]) -> Result<PluginArgs, ArgsError> {
        let mut out = PluginArgs::default();
        for arg in argv {
            let (key, value) = arg
                .split_once('=')
                .ok_or_else(|| ArgsError(format!("{arg:?} is not key=value")))?;
            match key {
                "config" => {
                    if out.config.is_some() {
                        return Err(ArgsError("config= is given twice".into()));
                    }
                    let path = PathBuf::from(value);
                    if !path.is_absolute() {
                        return Err(ArgsError(format!("config={value:?} must be an absolute path")));
                    }
                    out.config = Some(path);
                }
                other => return Err(ArgsError(format!("unknown argument {other:?}"))),
            }
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
    }

    #[test]
    fn invalid_arguments_name_the_problem() {
        for (argv, needle) in [
            (vec!["config"], "\"config\" is not key=value"),
            (vec!["config=rel.toml"], "must be an absolute path"),
            (vec!["config=/a", "config=/b"], "given twice"),
            (vec!["debug=1"], "unknown argument \"debug\""),
        ] {
            let err = PluginArgs::parse(&argv).unwrap_err().to_string();
            assert!(err.contains(needle), "{argv:?}: {err}");
            assert!(err.starts_with("plugstack.conf arguments:"), "{err}");
        }
    }
}
