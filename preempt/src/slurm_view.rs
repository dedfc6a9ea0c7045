//! What `gpu-mode-run` reads of its own job from Slurm, and the one change
//! it makes besides a plain requeue: moving the job off this node.
//!
//! Every read asks squeue (or sinfo) for the fields it needs alone, never
//! `scontrol show job`: that prints the job's name, command, directory and
//! comment before its state, and a job named `x JobState=CANCELLED` must not
//! be taken for a cancelled one (security review F5's shape; issue 27 item
//! 2). The values asked for hold no spaces, so a line that does not split
//! into exactly the fields asked for is ambiguous and read as unknown.

use crate::drain::{DrainError, Scontrol};
use std::path::Path;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(30);

/// The job's state and whether Slurm is preempting it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobState {
    /// squeue's `%T` (`RUNNING`, `CANCELLED`, ...).
    pub state: String,
    /// A preemption time is set: Slurm signalled the job to preempt it (it
    /// resets the field when it requeues the job).
    pub being_preempted: bool,
}

impl JobState {
    /// From squeue's one line for `-O State,PreemptTime`.
    fn parse(lines: &[String]) -> Option<JobState> {
        let [line] = lines else { return None };
        let [state, preempt] = line.split_whitespace().collect::<Vec<_>>()[..] else { return None };
        let being_preempted = !matches!(preempt, "None" | "Unknown" | "N/A" | "(null)" | "0");
        Some(JobState { state: state.to_string(), being_preempted })
    }
}

/// Why the job cannot be moved off this node: Slurm could not say where it
/// may run, the answer was not one line of the fields asked for, no node of
/// its partition would be left, or the update failed. The wrapper says it
/// and the job fails as for any refused restore (review F7), so each
/// variant's Display is the line's words.
#[derive(Debug, thiserror::Error)]
pub enum SlurmViewError {
    /// squeue failed, timed out or no longer knows the job (`field`
    /// reads that as unknown, as `job_state` does).
    #[error("squeue cannot say the job's partition and excluded nodes")]
    Unknown,
    /// An array's tasks, or none: which line is the job's cannot be told.
    #[error("squeue printed {count} lines for the job, not one")]
    Lines { count: usize },
    /// Not `<partition>` or `<partition> <nodes>` (the values hold no blanks).
    #[error("squeue's line {line:?} is not a partition and a node list")]
    NotPartitionAndNodes { line: String },
    /// The excluded nodes are no hostlist expression we can expand.
    #[error(transparent)]
    Hostlist(crate::hostlist::HostlistError),
    /// sinfo failed or timed out.
    #[error("sinfo cannot list partition {partition}'s nodes: {source}")]
    PartitionNodes { partition: String, source: DrainError },
    /// The job would pend for ever.
    #[error("every node of partition {partition} ({}) would be excluded", .nodes.join(","))]
    NoNodeLeft { partition: String, nodes: Vec<String> },
    /// `scontrol update ... ExcNodeList=` failed.
    #[error(transparent)]
    Exclude(DrainError),
}

/// The Slurm client programs, found beside the configured scontrol.
pub struct SlurmView {
    scontrol: Scontrol,
}

impl SlurmView {
    pub fn new(scontrol: &Path) -> SlurmView {
        SlurmView { scontrol: Scontrol::new(scontrol).with_timeout(TIMEOUT) }
    }

    /// The job's state; `None` when Slurm cannot say or says it ambiguously.
    pub fn job_state(&self, job: u32) -> Option<JobState> {
        let lines = self.field(job, &["-O", "State,PreemptTime"])?;
        JobState::parse(&lines)
    }

    /// The nodes the job may no longer run on once `node` is added to its
    /// excluded nodes, as an `ExcNodeList=` value; an error when that would
    /// leave its partition no node (the job would pend for ever) or when
    /// Slurm cannot say.
    pub fn exclusion_with(&self, job: u32, node: &str) -> Result<String, SlurmViewError> {
        let lines = self.field(job, &["-o", "%P %x"]).ok_or(SlurmViewError::Unknown)?;
        let (partition, excluded) = partition_and_excluded(&lines)?;
        let nodes = match self.scontrol.partition_nodes(&partition) {
            Ok(nodes) => nodes,
            Err(source) => return Err(SlurmViewError::PartitionNodes { partition, source }),
        };
        exclusion(&excluded, node, &partition, &nodes)
    }

    /// `scontrol update JobId=<job> ExcNodeList=<nodes>`: Slurm takes it
    /// only while the job pends, i.e. after its requeue.
    pub fn exclude(&self, job: u32, nodes: &str) -> Result<(), SlurmViewError> {
        self.scontrol.update_job(job, "ExcNodeList", nodes).map_err(SlurmViewError::Exclude)
    }

    fn field(&self, job: u32, format: &[&str]) -> Option<Vec<String>> {
        self.scontrol.job_field(job, format).ok().flatten()
    }
}

/// squeue's one `%P %x` line: the partition and the excluded nodes (none
/// printed as nothing or `(null)`).
fn partition_and_excluded(lines: &[String]) -> Result<(String, Vec<String>), SlurmViewError> {
    let [line] = lines else { return Err(SlurmViewError::Lines { count: lines.len() }) };
    match line.split_whitespace().collect::<Vec<_>>()[..] {
        [partition] => Ok((partition.to_string(), Vec::new())),
        [partition, "(null)"] => Ok((partition.to_string(), Vec::new())),
        [partition, excluded] => Ok((partition.to_string(), crate::hostlist::expand(excluded).map_err(SlurmViewError::Hostlist)?)),
        _ => Err(SlurmViewError::NotPartitionAndNodes { line: line.clone() }),
    }
}

/// The excluded nodes with `node` added, unless no node of the partition
/// would be left.
fn exclusion(excluded: &[String], node: &str, partition: &str, partition_nodes: &[String]) -> Result<String, SlurmViewError> {
    let mut list: Vec<String> = excluded.to_vec();
    if !list.iter().any(|n| n == node) {
        list.push(node.to_string());
    }
    if partition_nodes.iter().all(|n| list.contains(n)) {
        return Err(SlurmViewError::NoNodeLeft { partition: partition.to_string(), nodes: partition_nodes.to_vec() });
    }
    Ok(list.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(String::from).collect()
    }

    #[test]
    fn the_state_is_squeues_two_fields_or_unknown() {
        let cases: &[(&str, Option<(&str, bool)>)] = &[
            ("RUNNING             None                ", Some(("RUNNING", false))),
            ("RUNNING             2026-11-27T03:00:01 ", Some(("RUNNING", true))),
            ("CANCELLED           N/A", Some(("CANCELLED", false))),
            ("PENDING Unknown", Some(("PENDING", false))),
            // Not the two fields asked for: never guessed.
            ("RUNNING", None),
            ("RUNNING None extra", None),
            ("", None),
            ("RUNNING None\nRUNNING None", None),
        ];
        for (text, want) in cases {
            let got = JobState::parse(&lines(text));
            assert_eq!(got.as_ref().map(|s| (s.state.as_str(), s.being_preempted)), *want, "{text:?}");
        }
    }

    #[test]
    fn partition_and_excluded_nodes_come_from_one_line() {
        let ok: &[(&str, &str, &[&str])] = &[
            ("low ", "low", &[]),
            ("low (null)", "low", &[]),
            ("low gmb", "low", &["gmb"]),
            ("gpu node[01-03]", "gpu", &["node01", "node02", "node03"]),
        ];
        for (text, partition, excluded) in ok {
            let (p, e) = partition_and_excluded(&lines(text)).unwrap();
            assert_eq!((p.as_str(), e.iter().map(String::as_str).collect::<Vec<_>>()), (*partition, excluded.to_vec()), "{text:?}");
        }
        for bad in ["", "low a b", "low\nlow", "low n[3-1]"] {
            assert!(partition_and_excluded(&lines(bad)).is_err(), "{bad:?}");
        }
    }

    /// Each refusal to move the job has its kind and the words the wrapper
    /// said before.
    #[test]
    fn each_reason_not_to_move_the_job_says_todays_words() {
        let kind = |text: &str| match partition_and_excluded(&lines(text)).unwrap_err() {
            SlurmViewError::Lines { .. } => "lines",
            SlurmViewError::NotPartitionAndNodes { .. } => "not_partition_and_nodes",
            SlurmViewError::Hostlist(crate::hostlist::HostlistError::Item { .. }) => "hostlist",
            other => panic!("{other:?}"),
        };
        assert_eq!([kind(""), kind("low\nlow"), kind("low a b"), kind("low n[3-1]")], ["lines", "lines", "not_partition_and_nodes", "hostlist"]);
        let failed = || DrainError::Failed { path: "/usr/bin/sinfo".into(), args: "-h -N -p low -o %N".into(), status: "exit status: 1".into(), stderr: "no such partition".into() };
        let cases = [
            (SlurmViewError::Unknown, "squeue cannot say the job's partition and excluded nodes"),
            (SlurmViewError::Lines { count: 2 }, "squeue printed 2 lines for the job, not one"),
            (SlurmViewError::NotPartitionAndNodes { line: "low a b".into() }, "squeue's line \"low a b\" is not a partition and a node list"),
            (SlurmViewError::Hostlist(crate::hostlist::HostlistError::EmptyName { expr: "a,,b".into() }), "empty name in \"a,,b\""),
            (
                SlurmViewError::PartitionNodes { partition: "low".into(), source: failed() },
                "sinfo cannot list partition low's nodes: /usr/bin/sinfo -h -N -p low -o %N failed (exit status: 1): no such partition",
            ),
            (SlurmViewError::NoNodeLeft { partition: "low".into(), nodes: vec!["gma".into(), "gmb".into()] }, "every node of partition low (gma,gmb) would be excluded"),
            (SlurmViewError::Exclude(failed()), "/usr/bin/sinfo -h -N -p low -o %N failed (exit status: 1): no such partition"),
        ];
        for (e, text) in cases {
            assert_eq!(e.to_string(), text, "{e:?}");
        }
    }

    #[test]
    fn this_node_is_added_unless_the_partition_would_have_none_left() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        type Case<'a> = (&'a [&'a str], &'a str, &'a [&'a str], Result<&'a str, &'a str>);
        let cases: &[Case] = &[
            (&[], "gma", &["gma", "gmb"], Ok("gma")),
            (&["gmc"], "gma", &["gma", "gmb"], Ok("gmc,gma")),
            (&["gma"], "gma", &["gma", "gmb"], Ok("gma")),
            (&[], "gma", &["gma"], Err("every node of partition low (gma) would be excluded")),
            (&["gmb"], "gma", &["gma", "gmb"], Err("every node of partition low (gma,gmb) would be excluded")),
        ];
        for (excluded, node, nodes, want) in cases {
            let got = exclusion(&names(excluded), node, "low", &names(nodes));
            assert_eq!(got.as_deref().map_err(|e| e.to_string()), (*want).map_err(str::to_string), "{excluded:?} + {node} of {nodes:?}");
            assert!(got.as_ref().is_ok() || matches!(got, Err(SlurmViewError::NoNodeLeft { .. })), "{got:?}");
        }
    }
}
