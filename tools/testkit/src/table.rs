//! One row of a decision table whose outcome is a value or an error.

use std::fmt::Debug;

/// Checks a row: a value must equal the wanted one; an error must contain
/// the wanted part (messages carry details a row need not repeat, such as
/// clap's usage lines). Panics naming the row otherwise.
pub fn check_row<T: PartialEq + Debug>(row: &str, got: Result<T, String>, want: Result<T, &str>) {
    match (got, want) {
        (Ok(got), Ok(want)) => assert_eq!(got, want, "{row}"),
        (Err(err), Err(part)) => assert!(err.contains(part), "{row}: {err:?} lacks {part:?}"),
        (got, want) => panic!("{row}: got {got:?}, wanted {want:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_passes_only_on_the_wanted_value_or_error() {
        check_row("same value", Ok(1), Ok(1));
        check_row("error part", Err::<u8, _>("no check named x; checks: a".into()), Err("no check named x"));
        let fails = |got: Result<u8, String>, want: Result<u8, &'static str>| std::panic::catch_unwind(|| check_row("r", got, want)).is_err();
        assert!(fails(Ok(1), Ok(2)), "another value");
        assert!(fails(Err("boom".into()), Err("bang")), "another error");
        assert!(fails(Ok(1), Err("bang")), "a value for an error");
        assert!(fails(Err("boom".into()), Ok(1)), "an error for a value");
    }
}
