//! The Prometheus text exposition format (0.0.4), which node_exporter's
//! textfile collector reads.
//!
//! Hand-written on purpose: the maintained crates keep live, in-process
//! metrics (`prometheus` sets histogram buckets only through observe() or
//! its protobuf structs; `prometheus-client` writes OpenMetrics, whose
//! `# EOF` and `_total`-less TYPE lines the textfile collector does not
//! expect). Our values are folded from a state file by short-lived
//! processes, so what is needed is only a writer of already-known numbers:
//! HELP/TYPE per family, escaped label values, cumulative buckets.

use std::fmt::Write as _;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Label pairs in the order given.
pub type Labels = Vec<(&'static str, String)>;

/// Escapes a label value: backslash, double quote and newline.
pub fn escape_label_value(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// `{a="x",b="y"}`, or nothing for no labels.
pub fn label_set(labels: &[(&str, String)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape_label_value(v))).collect();
    format!("{{{}}}", pairs.join(","))
}

/// Numbers as Prometheus reads them (`+Inf`, integers without a fraction).
pub fn number(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 { "+Inf".into() } else { "-Inf".into() };
    }
    if v.is_nan() {
        return "NaN".into();
    }
    format!("{v}")
}

/// Writes one family: HELP and TYPE, then its samples.
pub struct FamilyWriter<'a> {
    out: &'a mut String,
    name: &'a str,
}

impl<'a> FamilyWriter<'a> {
    pub fn begin(out: &'a mut String, name: &'a str, kind: Kind, help: &str) -> FamilyWriter<'a> {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {}", kind.as_str());
        FamilyWriter { out, name }
    }

    /// A counter or gauge sample; `labels` is a rendered [`label_set`].
    pub fn sample(&mut self, labels: &str, value: f64) {
        let _ = writeln!(self.out, "{}{labels} {}", self.name, number(value));
    }

    /// A histogram's series: `counts[i]` observations fell into `(bounds[i-1], bounds[i]]`
    /// (the last one past every bound); written cumulative, as the format wants.
    pub fn histogram(&mut self, labels: &[(&str, String)], bounds: &[f64], counts: &[u64], sum: f64) {
        let mut cumulative = 0u64;
        for (i, bound) in bounds.iter().map(|b| number(*b)).chain(std::iter::once("+Inf".to_string())).enumerate() {
            cumulative += counts.get(i).copied().unwrap_or(0);
            let mut with_le: Vec<(&str, String)> = labels.to_vec();
            with_le.push(("le", bound));
            let _ = writeln!(self.out, "{}_bucket{} {cumulative}", self.name, label_set(&with_le));
        }
        let set = label_set(labels);
        let _ = writeln!(self.out, "{}_sum{set} {}", self.name, number(sum));
        let _ = writeln!(self.out, "{}_count{set} {cumulative}", self.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let cases = [("plain", "plain"), ("a\"b", "a\\\"b"), ("a\\b", "a\\\\b"), ("two\nlines", "two\\nlines")];
        for (raw, want) in cases {
            assert_eq!(escape_label_value(raw), want, "{raw:?}");
        }
        assert_eq!(label_set(&[]), "");
        assert_eq!(label_set(&[("mode", "mps".into()), ("outcome", "ok".into())]), "{mode=\"mps\",outcome=\"ok\"}");
    }

    #[test]
    fn numbers_are_written_as_prometheus_reads_them() {
        for (v, want) in [(3.0, "3"), (0.25, "0.25"), (f64::INFINITY, "+Inf"), (f64::NEG_INFINITY, "-Inf"), (1e21, "1000000000000000000000")] {
            assert_eq!(number(v), want);
        }
        assert_eq!(number(f64::NAN), "NaN");
    }

    #[test]
    fn histograms_are_cumulative_with_inf_sum_and_count() {
        let mut s = String::new();
        let mut w = FamilyWriter::begin(&mut s, "x_seconds", Kind::Histogram, "Time.");
        w.histogram(&[("phase", "dump".into())], &[0.1, 1.0], &[2, 1, 4], 12.5);
        let want = "# HELP x_seconds Time.\n# TYPE x_seconds histogram\n\
                    x_seconds_bucket{phase=\"dump\",le=\"0.1\"} 2\n\
                    x_seconds_bucket{phase=\"dump\",le=\"1\"} 3\n\
                    x_seconds_bucket{phase=\"dump\",le=\"+Inf\"} 7\n\
                    x_seconds_sum{phase=\"dump\"} 12.5\n\
                    x_seconds_count{phase=\"dump\"} 7\n";
        assert_eq!(s, want);
    }
}
