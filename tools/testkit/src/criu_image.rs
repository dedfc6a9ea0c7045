//! Protobuf, only as much as forging a CRIU core image takes (shared by the
//! real-CRIU tests of checkpoint/tests/preempt_criu.rs and the Slurm tests
//! of tests/tests/preempt_checkpoint.rs, which forge what a user who got
//! past the agent's checks would write). Written by hand: a test must be
//! able to write fields no CRIU would, and no protobuf crate takes CRIU's
//! .proto files without CRIU's own build.
//!
//! An image is two u32 magics, then entries: a u32 length (little-endian)
//! and that many bytes of protobuf; core-<pid>.img holds one CoreEntry
//! (CRIU's images/core.proto). Where the fields are:
//! * the task's creds: CoreEntry.thread_core (5).creds (10), a CredsEntry
//!   (images/creds.proto: uid 1, gid 2, euid 3, egid 4, suid 5, sgid 6,
//!   fsuid 7, fsgid 8, cap_inh 9, cap_prm 10, cap_eff 11, cap_bnd 12,
//!   cap_amb 19, each repeated uint32 one field per word);
//! * its scheduling: CoreEntry.thread_core (5): sched_policy 4, sched_prio 5;
//! * its resource limits: CoreEntry.tc (3).rlimits (8), a
//!   TaskRlimitsEntry whose repeated rlimits (1) are RlimitEntry {cur 1,
//!   max 2}, one per RLIMIT_* in the kernel's order.
//!
//! A field is a varint key (number << 3 | wire type) and a value: a varint
//! (type 0), 8 bytes (1), a varint length and that many bytes (2), 4 bytes
//! (5). Fields may come in any order, so a changed field is written at the
//! end of its message.

/// Reads a varint at `at`, moving `at` past it.
pub fn varint(b: &[u8], at: &mut usize) -> u64 {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = b[*at];
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return v;
        }
    }
    panic!("a varint of more than 10 bytes");
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// One field of a message: its number, wire type, whole encoding, and its
/// value's bytes without the key and length.
pub type Field<'a> = (u64, u64, &'a [u8], &'a [u8]);

/// A message's fields in order.
pub fn fields(b: &[u8]) -> Vec<Field<'_>> {
    let (mut at, mut out) = (0, Vec::new());
    while at < b.len() {
        let start = at;
        let key = varint(b, &mut at);
        let mut value = at;
        match key & 7 {
            0 => {
                varint(b, &mut at);
            }
            1 => at += 8,
            2 => {
                let len = varint(b, &mut at) as usize;
                value = at;
                at += len;
            }
            5 => at += 4,
            w => panic!("wire type {w} in a CRIU image"),
        }
        out.push((key >> 3, key & 7, &b[start..at], &b[value..at]));
    }
    out
}

/// The varint values of field `number` (a repeated one's, in order).
pub fn values(msg: &[u8], number: u64) -> Vec<u64> {
    let mut out = Vec::new();
    for (_, wire, _, value) in fields(msg).into_iter().filter(|f| f.0 == number) {
        assert_eq!(wire, 0, "field {number} is not a varint");
        out.push(varint(value, &mut 0));
    }
    out
}

/// The bytes of message field `number` (the first).
pub fn message(msg: &[u8], number: u64) -> Vec<u8> {
    fields(msg).iter().find(|f| f.0 == number && f.1 == 2).map(|f| f.3.to_vec()).unwrap_or_else(|| panic!("no message field {number}"))
}

/// The bytes of every message field `number` (a repeated one's, in order).
pub fn messages(msg: &[u8], number: u64) -> Vec<Vec<u8>> {
    fields(msg).iter().filter(|f| f.0 == number && f.1 == 2).map(|f| f.3.to_vec()).collect()
}

/// `msg` without field `number`, then `with` (whole encoded fields).
fn replace(msg: &[u8], number: u64, with: &[u8]) -> Vec<u8> {
    let mut out: Vec<u8> = fields(msg).iter().filter(|f| f.0 != number).flat_map(|f| f.2.to_vec()).collect();
    out.extend_from_slice(with);
    out
}

fn message_field(number: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(&mut out, number << 3 | 2);
    put_varint(&mut out, body.len() as u64);
    out.extend_from_slice(body);
    out
}

fn varint_field(number: u64, value: u64) -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(&mut out, number << 3);
    put_varint(&mut out, value);
    out
}

/// The one CoreEntry of a core image: (the two magics, the entry).
pub fn core_entry(image: &[u8]) -> (&[u8], &[u8]) {
    let (magics, rest) = image.split_at(8);
    let len = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
    assert_eq!(rest.len(), 4 + len, "a core image holds one CoreEntry");
    (magics, &rest[4..])
}

/// A core image of `magics` and `core`.
fn core_image(magics: &[u8], core: &[u8]) -> Vec<u8> {
    [magics, &(core.len() as u32).to_le_bytes(), core].concat()
}

/// The creds of a core image.
pub fn creds(image: &[u8]) -> Vec<u8> {
    message(&message(core_entry(image).1, 5), 10)
}

/// `image` with each creds field of `set` holding the values given (a
/// repeated field one per word) in place of the dumped ones.
pub fn forge_creds(image: &[u8], set: &[(u64, &[u32])]) -> Vec<u8> {
    let (magics, core) = core_entry(image);
    let thread_core = message(core, 5);
    let mut creds = message(&thread_core, 10);
    for (number, words) in set {
        let with: Vec<u8> = words.iter().flat_map(|w| varint_field(*number, u64::from(*w))).collect();
        creds = replace(&creds, *number, &with);
    }
    let thread_core = replace(&thread_core, 10, &message_field(10, &creds));
    core_image(magics, &replace(core, 5, &message_field(5, &thread_core)))
}

/// The task's resource limits as dumped, `(cur, max)` per RLIMIT_* index.
pub fn rlimits(image: &[u8]) -> Vec<(u64, u64)> {
    let rlimits = message(&message(core_entry(image).1, 3), 8);
    messages(&rlimits, 1).iter().map(|r| (values(r, 1)[0], values(r, 2)[0])).collect()
}

/// `image` with the limits of `set` (`(RLIMIT_* index, cur, max)`) in place
/// of the dumped ones.
pub fn forge_rlimits(image: &[u8], set: &[(usize, u64, u64)]) -> Vec<u8> {
    let (magics, core) = core_entry(image);
    let mut limits = rlimits(image);
    for (index, cur, max) in set {
        limits[*index] = (*cur, *max);
    }
    let entries: Vec<u8> = limits.iter().flat_map(|(cur, max)| message_field(1, &[varint_field(1, *cur), varint_field(2, *max)].concat())).collect();
    let tc = replace(&message(core, 3), 8, &message_field(8, &entries));
    core_image(magics, &replace(core, 3, &message_field(3, &tc)))
}

/// `image` with the task's scheduling policy and priority forged.
pub fn forge_sched(image: &[u8], policy: u32, prio: u32) -> Vec<u8> {
    let (magics, core) = core_entry(image);
    let mut thread_core = message(core, 5);
    thread_core = replace(&thread_core, 4, &varint_field(4, u64::from(policy)));
    thread_core = replace(&thread_core, 5, &varint_field(5, u64::from(prio)));
    core_image(magics, &replace(core, 5, &message_field(5, &thread_core)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A core image made by hand: magics, then a CoreEntry with tc
    /// (rlimits: two limits) and thread_core (creds: uid 7, one cap word).
    fn image() -> Vec<u8> {
        let limit = |cur, max| message_field(1, &[varint_field(1, cur), varint_field(2, max)].concat());
        let tc = message_field(8, &[limit(1, 2), limit(u64::MAX, u64::MAX)].concat());
        let creds = [varint_field(1, 7), varint_field(9, 0)].concat();
        let thread_core = [varint_field(1, 0), varint_field(4, 0), message_field(10, &creds)].concat();
        let core = [varint_field(1, 1), message_field(3, &tc), message_field(5, &thread_core)].concat();
        core_image(&[0xaa; 8], &core)
    }

    #[test]
    fn forged_fields_read_back_and_the_rest_is_kept() {
        let img = image();
        assert_eq!(rlimits(&img), [(1, 2), (u64::MAX, u64::MAX)]);
        let forged = forge_rlimits(&img, &[(0, 99, 99)]);
        assert_eq!(rlimits(&forged), [(99, 99), (u64::MAX, u64::MAX)]);
        assert_eq!(values(&creds(&forged), 1), [7], "the creds are kept");
        let forged = forge_creds(&forged, &[(9, &[0, 0x100])]);
        assert_eq!(values(&creds(&forged), 9), [0, 0x100]);
        assert_eq!(rlimits(&forged)[0], (99, 99), "the limits are kept");
        let forged = forge_sched(&forged, 1, 50);
        let thread_core = message(core_entry(&forged).1, 5);
        assert_eq!((values(&thread_core, 4), values(&thread_core, 5)), (vec![1], vec![50]));
        assert_eq!(&forged[..8], &[0xaa; 8], "the magics are kept");
    }
}
