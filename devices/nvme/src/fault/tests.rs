//! NVMe specs through the shared grammar: every action and filter, the
//! canonical form, errors, matching, the armed specs' decisions and bad
//! blocks, and opcode names from the command tables.

use std::time::Duration;

use p2plab_fault::{round_trip, Idle, SpecError};

use super::*;
use crate::admin::ADMIN_COMMANDS;
use crate::io::IO_COMMANDS;

fn parse(text: &str) -> FaultSpec {
    text.parse()
        .unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
}

fn refuse(text: &str) -> SpecError {
    match text.parse::<FaultSpec>() {
        Ok(spec) => panic!("{text:?} should be refused, parsed as {spec:?}"),
        Err(e) => e,
    }
}

/// Catches: a field of a spec read wrongly or not at all.
#[test]
fn parses_the_fields_of_a_status_spec() {
    let s = parse("status=0x281,dnr,count=3,opcode=read,nsid=1,lba=0-1023");
    assert_eq!(
        s.action,
        Action::Status {
            sct_sc: 0x281,
            dnr: true,
            more: false
        }
    );
    assert_eq!(s.count, Some(3));
    assert_eq!(
        s.filter.opcode,
        Some(Opcode {
            set: CommandSet::Io,
            value: 0x02
        })
    );
    assert_eq!(s.filter.nsid, Some(1));
    assert_eq!(
        s.filter.lba,
        Some(LbaRange {
            first: 0,
            last: 1023
        })
    );
    assert_eq!(s.filter.queue, None);
}

/// Catches: an action word that is not NVMe's, or parses to another
/// action, in either separator style.
#[test]
fn parses_every_action_in_both_separator_styles() {
    assert_eq!(parse("media-error:lba=100-199").action, Action::MediaError);
    assert_eq!(parse("media-error:lba=100-199").filter.nsid, Some(1));
    let t = parse("timeout:opcode=read,count=1");
    assert_eq!(t.action, Action::Timeout { abortable: true });
    assert_eq!(t.count, Some(1));
    assert_eq!(
        parse("timeout,no-abort").action,
        Action::Timeout { abortable: false }
    );
    assert_eq!(
        parse("latency=5ms:opcode=write").action,
        Action::Latency {
            min: Duration::from_millis(5),
            max: Duration::from_millis(5)
        }
    );
    assert_eq!(
        parse("latency=250us").action,
        Action::Latency {
            min: Duration::from_micros(250),
            max: Duration::from_micros(250)
        }
    );
    let cfs = parse("cfs");
    assert_eq!(cfs.action, Action::ControllerFatal);
    assert_eq!(cfs.count, Some(1), "cfs fires once unless asked");
    let bug = parse("internal-error,opcode=read");
    assert_eq!(bug.action, Action::InternalError);
    assert_eq!(bug.count, Some(1), "internal-error fires once unless asked");
    assert_eq!(parse("drop-irq:count=1").action, Action::DropInterrupt);
    assert_eq!(
        parse("delay-irq=3ms").action,
        Action::DelayInterrupt(Duration::from_millis(3))
    );
    assert_eq!(parse("corrupt:lba=8-15").action, Action::Corrupt);
    assert_eq!(parse("peer-fail:count=1").action, Action::PeerFail);
    assert_eq!(
        parse("peer-stall=5ms").action,
        Action::PeerStall(Duration::from_millis(5))
    );
    assert!(parse("peer-stall=5ms").action.is_peer());
    assert_eq!(
        parse("ns-not-ready,nsid=2").action,
        Action::NamespaceNotReady { dnr: false }
    );
    assert_eq!(
        parse("ns-not-ready,dnr").action,
        Action::NamespaceNotReady { dnr: true }
    );
    assert_eq!(
        parse("status=0x4,more").action,
        Action::Status {
            sct_sc: 4,
            dnr: false,
            more: true
        }
    );
    assert_eq!(parse("status=0x4,prob=25%").probability, Some(0.25));
    assert_eq!(parse("status=0x4,probability=0.5").probability, Some(0.5));
    assert_eq!(parse("status=0x4,qid=3").filter.queue, Some(3));
    let admin = parse("status=0x6,admin-opcode=identify");
    assert!(admin.filter.admin());
    assert!(parse("status=0x6,queue=0").filter.admin());
    assert!(!parse("status=0x6").filter.admin());
}

/// Catches a printer and a parser that disagree: what `status` shows
/// must be pasteable, and users' scripts keep the text they have.
#[test]
fn canonical_text_round_trips() {
    for text in [
        "status=0x281,dnr,count=3,opcode=read,nsid=1,lba=0-1023",
        "status=0x004,more,prob=0.5,queue=2",
        "status=0x281,count=1,after=99,opcode=read",
        "ns-not-ready,dnr,nsid=2",
        "media-error,nsid=1,lba=100-199",
        "timeout,no-abort,count=1,opcode=read",
        "latency=5ms,opcode=write",
        "latency=2s",
        "latency=7us",
        "latency=1ms-20ms",
        "delay-irq=3ms,count=1",
        "cfs,count=1",
        "internal-error,count=1,opcode=read",
        "drop-irq,count=1",
        "corrupt,lba=7",
        "peer-fail,count=1",
        "peer-stall=5ms,prob=0.5,after=2",
        "status=0x006,admin-opcode=identify",
        "status=0x006,admin-opcode=0x7f",
        "status=0x002,opcode=0x99",
        "status=0x281,opcode=dsm",
        "status=0x280,opcode=write-zeroes",
    ] {
        let spec = parse(text);
        assert_eq!(spec.to_string(), text);
        assert_eq!(round_trip::<Action>(text), Some(spec));
    }
    assert_eq!(
        parse("media-error:lba=100-199").to_string(),
        "media-error,nsid=1,lba=100-199"
    );
    assert_eq!(
        parse("status=0x2,opcode=0x02").to_string(),
        "status=0x002,opcode=read",
        "a number with a row prints as the row's name"
    );
}

/// Catches errors that do not say which item is wrong.
#[test]
fn errors_name_the_bad_item() {
    let cases = [
        ("status=0x281,count=x", "count=x"),
        ("status=0x281,count=0", "count=0"),
        ("status", "status"),
        ("status=0", "status=0"),
        ("status=0x800", "status=0x800"),
        ("explode", "explode"),
        ("latency=5", "latency=5"),
        ("latency=5h", "latency=5h"),
        ("latency=61s", "latency=61s"),
        ("latency=9ms-2ms", "latency=9ms-2ms"),
        ("latency=1ms-", "latency=1ms-"),
        ("delay-irq", "delay-irq"),
        ("timeout,dnr", "dnr"),
        ("timeout,no-abort=1", "no-abort=1"),
        ("cfs,more", "more"),
        ("drop-irq,no-abort", "no-abort"),
        ("status=0x4,prob=0", "prob=0"),
        ("status=0x4,prob=150%", "prob=150%"),
        ("status=0x4,opcode=reed", "opcode=reed"),
        ("status=0x4,opcode=0x100", "opcode=0x100"),
        ("status=0x4,admin-opcode", "admin-opcode"),
        ("status=0x4,queue=70000", "queue=70000"),
        ("status=0x4,nsid=0", "nsid=0"),
        ("status=0x4,lba=9-3", "lba=9-3"),
        ("status=0x4,colour=red", "colour=red"),
        ("status=0x4,dnr=1", "dnr=1"),
        ("cfs=1", "cfs=1"),
        ("peer-fail=1", "peer-fail=1"),
        ("peer-fail,dnr", "dnr"),
        ("peer-stall", "peer-stall"),
        ("peer-stall=5h", "peer-stall=5h"),
        ("status=0x281,cnt=1", "cnt=1"),
    ];
    for (text, item) in cases {
        let e = refuse(text);
        assert_eq!(e.item, item, "{text}: {e}");
        assert!(!e.message.is_empty());
    }
    for text in [
        "media-error",
        "media-error,lba=1-2,count=1",
        "media-error,lba=1-2,after=1",
        "media-error,lba=1-2,opcode=read",
        "corrupt,opcode=write",
        "corrupt,admin-opcode=identify",
        "peer-fail,opcode=read",
        "peer-stall=1ms,lba=0-7",
        "status=0x4,queue=0,opcode=read",
        "status=0x4,queue=1,admin-opcode=identify",
        "",
        "status=0x4,,count=1",
        "status=0x4,",
    ] {
        refuse(text);
    }
    let unknown = refuse("status=0x281,cnt=1");
    assert!(unknown.to_string().starts_with("cnt=1: "), "{unknown}");
    assert!(
        unknown.message.contains("dnr, more, no-abort")
            && unknown.message.contains("count=, prob=, after=")
            && unknown.message.contains("admin-opcode="),
        "{unknown}"
    );
}

fn io(opcode: u8, nsid: u32, lba: Option<(u64, u64)>) -> CommandInfo {
    CommandInfo {
        queue: 1,
        opcode,
        nsid,
        lba,
    }
}

/// Catches filters that ignore a field, LBA overlap off by one, and a
/// bare spec that would hit admin commands.
#[test]
fn matches_on_every_field() {
    let s = parse("status=0x281,opcode=read,nsid=1,lba=100-199").filter;
    assert!(s.applies_to(&io(0x02, 1, Some((100, 1)))));
    assert!(s.applies_to(&io(0x02, 1, Some((199, 1)))));
    assert!(s.applies_to(&io(0x02, 1, Some((90, 11)))));
    assert!(!s.applies_to(&io(0x02, 1, Some((90, 10)))));
    assert!(!s.applies_to(&io(0x02, 1, Some((200, 8)))));
    assert!(!s.applies_to(&io(0x01, 1, Some((100, 1)))));
    assert!(!s.applies_to(&io(0x02, 2, Some((100, 1)))));
    assert!(!s.applies_to(&io(0x02, 1, None)));
    let bare = parse("status=0x4").filter;
    assert!(bare.applies_to(&io(0x00, 1, None)));
    let admin_cmd = CommandInfo {
        queue: 0,
        opcode: 0x06,
        nsid: 0,
        lba: None,
    };
    assert!(!bare.applies_to(&admin_cmd));
    assert!(parse("status=0x4,admin-opcode=identify")
        .filter
        .applies_to(&admin_cmd));
    assert!(!parse("status=0x4,admin-opcode=abort")
        .filter
        .applies_to(&admin_cmd));
    let q = parse("status=0x4,queue=2").filter;
    assert!(!q.applies_to(&io(0x02, 1, None)));
    assert!(q.applies_to(&CommandInfo {
        queue: 2,
        ..io(0x02, 1, None)
    }));
}

/// Catches: a command row that cannot be targeted by name (a second list
/// of names that fell behind the tables), a name that parses to another
/// opcode, or a printed filter that does not parse back. Adding a row is
/// enough: this test reads the tables.
#[test]
fn every_command_of_every_table_is_an_opcode_filter() {
    let sets = [
        ("opcode", CommandSet::Io, IO_COMMANDS.fault_names()),
        (
            "admin-opcode",
            CommandSet::Admin,
            ADMIN_COMMANDS.fault_names(),
        ),
    ];
    for (item, set, rows) in sets {
        assert!(rows.len() >= 7, "{item}: {rows:?}");
        for (value, name) in rows {
            let text = format!("status=0x004,{item}={name}");
            let spec = parse(&text);
            assert_eq!(spec.filter.opcode, Some(Opcode { set, value }), "{text}");
            assert_eq!(spec.to_string(), text);
            let by_number = parse(&format!("status=0x004,{item}={value:#04x}"));
            assert_eq!(by_number.to_string(), text, "a number prints as the name");
        }
    }
}

/// Catches: a list of command names brought back beside the tables (in
/// p2plab-fault or in this crate's fault code), where a new command
/// could fall out of it: no fault-name of any row may be spelled out as
/// a string there.
#[test]
fn no_fault_code_spells_out_a_command_name() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("src/fault_filter.rs")];
    for dir in [root.join("src/fault"), root.join("../fault/src")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            // This file included: it quotes names only inside specs.
            files.push(entry.unwrap().path());
        }
    }
    let names: Vec<&str> = IO_COMMANDS
        .fault_names()
        .into_iter()
        .chain(ADMIN_COMMANDS.fault_names())
        .map(|(_, name)| name)
        .collect();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        for name in &names {
            let quoted = format!("\"{name}\"");
            assert!(
                !text.contains(&quoted),
                "{} spells out {quoted}: opcode names come from the command tables",
                path.display()
            );
        }
    }
    assert!(files.len() >= 8, "{files:?}");
}

fn read(slba: u64, blocks: u64) -> CommandInfo {
    io(0x02, 1, Some((slba, blocks)))
}

fn armed(texts: &[&str]) -> NvmeFaults {
    let mut faults = NvmeFaults::default();
    for text in texts {
        faults.arm(parse(text)).unwrap();
    }
    faults
}

/// Catches: a count that is not honoured, exhausted specs that still
/// fire, or a status that does not reach the decision.
#[test]
fn count_limits_fires() {
    let mut inj = armed(&["status=0x281,dnr,count=2,opcode=read"]);
    assert!(!inj.is_idle());
    let statuses: Vec<_> = (0..4).map(|_| inj.decide(&read(0, 1)).status).collect();
    assert_eq!(
        statuses,
        vec![
            Some((0x281, true, false)),
            Some((0x281, true, false)),
            None,
            None
        ]
    );
    assert!(inj.is_idle());
    let r = &inj.report()[0];
    assert_eq!((r.fired, r.remaining), (2, Some(0)));
    assert_eq!(r.spec, "status=0x281,dnr,count=2,opcode=read");
}

/// Catches: disarming that leaves a media error's blocks bad, or takes
/// the wrong spec.
#[test]
fn disarm_removes_one_spec() {
    let mut inj = NvmeFaults::default();
    let a = inj.arm(parse("status=0x4")).unwrap();
    let b = inj.arm(parse("media-error,lba=1-2")).unwrap();
    assert!(inj.disarm(a));
    assert!(!inj.disarm(a));
    assert_eq!(inj.report().len(), 1);
    assert!(inj.decide(&read(0, 1)).is_none());
    assert!(inj.disarm(b));
    assert!(inj.is_idle(), "the media error's blocks went with it");
}

/// Catches a latency range that is ignored or escapes its bounds, and a
/// delayed interrupt that does not reach the decision.
#[test]
fn latency_ranges_spread_within_their_bounds() {
    let mut inj = armed(&["latency=1ms-3ms"]);
    let delays: Vec<Duration> = (0..500).map(|_| inj.decide(&read(0, 1)).latency).collect();
    let (lo, hi) = (Duration::from_millis(1), Duration::from_millis(3));
    assert!(delays.iter().all(|d| (lo..=hi).contains(d)));
    let mean = delays.iter().sum::<Duration>() / 500;
    assert!(
        (Duration::from_micros(1800)..Duration::from_micros(2200)).contains(&mean),
        "{mean:?}"
    );
    let mut inj = armed(&["delay-irq=4ms,count=1"]);
    assert_eq!(
        inj.decide(&read(0, 1)).interrupt_delay,
        Duration::from_millis(4)
    );
    assert_eq!(inj.decide(&read(0, 1)).interrupt_delay, Duration::ZERO);
}

/// Catches: specs that do not add up on one command, or a corruption
/// range that is not the spec's.
#[test]
fn several_specs_fire_on_one_command() {
    let mut inj = armed(&[
        "latency=5ms",
        "latency=2ms,opcode=read",
        "drop-irq,count=1",
        "corrupt,lba=10-11",
    ]);
    let d = inj.decide(&read(8, 8));
    assert_eq!(d.latency, Duration::from_millis(7));
    assert!(d.drop_interrupt);
    assert_eq!(
        d.corrupt,
        Some(LbaRange {
            first: 10,
            last: 11
        })
    );
    assert_eq!(d.fired, 4);
    let d = inj.decide(&read(0, 4));
    assert_eq!(d.fired, 2, "drop-irq spent, corrupt range missed");
    assert!(!d.drop_interrupt);
    assert_eq!(d.corrupt, None);
    let mut whole = armed(&["corrupt"]);
    assert_eq!(
        whole.decide(&read(4, 2)).corrupt,
        Some(LbaRange { first: 4, last: 5 })
    );
}

/// Catches repairs that clear too much or too little, merges that lose
/// blocks, and lookups that miss a range.
#[test]
fn bad_blocks_split_and_merge() {
    let mut inj = armed(&["media-error,lba=100-199"]);
    assert!(!inj.is_idle());
    let bad = inj.bad_blocks_mut();
    assert_eq!(bad.first_bad(1, 0, 100), None);
    assert_eq!(bad.first_bad(1, 0, 101), Some(100));
    assert_eq!(bad.first_bad(1, 150, 1000), Some(150));
    assert_eq!(bad.first_bad(1, 200, 8), None);
    assert_eq!(bad.first_bad(2, 150, 1), None);
    assert_eq!(bad.first_bad(1, 150, 0), None);
    bad.repair(1, 120, 10);
    let ranges: Vec<_> = bad.report().iter().map(|r| (r.first, r.last)).collect();
    assert_eq!(ranges, vec![(100, 119), (130, 199)]);
    assert_eq!(bad.first_bad(1, 120, 10), None);
    assert_eq!(bad.first_bad(1, 120, 11), Some(130));
    bad.add(
        1,
        LbaRange {
            first: 120,
            last: 129,
        },
    );
    bad.add(
        1,
        LbaRange {
            first: 200,
            last: 200,
        },
    );
    let ranges: Vec<_> = bad.report().iter().map(|r| (r.first, r.last)).collect();
    assert_eq!(ranges, vec![(100, 200)]);
    bad.add(1, LbaRange { first: 0, last: 5 });
    bad.add(1, LbaRange { first: 3, last: 99 });
    let ranges: Vec<_> = bad.report().iter().map(|r| (r.first, r.last)).collect();
    assert_eq!(ranges, vec![(0, 200)]);
    bad.repair(1, 0, 1000);
    assert!(bad.is_empty());
    assert!(inj.is_idle(), "the media-error spec itself does not count");
    assert!(inj.bad_blocks().is_empty());
}

/// Catches: a lookup that scans (a guest splitting a huge range with
/// every other write must not make each read slower).
#[test]
fn split_ranges_stay_a_lookup() {
    let mut bad = BadBlocks::default();
    bad.add(
        1,
        LbaRange {
            first: 0,
            last: 199_999,
        },
    );
    for lba in (0..200_000).step_by(2) {
        bad.repair(1, lba, 1);
    }
    assert_eq!(bad.report().len(), 100_000);
    let start = std::time::Instant::now();
    for lba in 0..100_000u64 {
        assert_eq!(bad.first_bad(1, lba * 2, 1), None);
        assert_eq!(bad.first_bad(1, lba * 2, 2), Some(lba * 2 + 1));
    }
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

/// Catches peer specs that fire on whole commands (and so on RAM
/// transfers), or whose count is not honoured per peer transfer.
#[test]
fn peer_specs_fire_on_peer_transfers_only() {
    let mut inj = armed(&["peer-fail,count=1", "peer-stall=3ms,count=2"]);
    assert!(inj.decide(&read(0, 1)).is_none(), "not a command fault");
    assert_eq!(inj.peer_transfer(), Some(PeerEffect::Fail));
    assert_eq!(
        inj.peer_transfer(),
        Some(PeerEffect::Stall(Duration::from_millis(3)))
    );
    assert_eq!(inj.peer_transfer(), None);
    assert!(inj.is_idle());
    let fired: Vec<_> = inj.report().iter().map(|r| r.fired).collect();
    assert_eq!(fired, vec![1, 2]);
}

/// Catches: media errors not counted on their spec, or a clear that
/// leaves blocks bad.
#[test]
fn media_errors_are_counted_on_their_spec_and_clear_disarms() {
    let mut inj = armed(&["media-error,lba=5-6"]);
    assert!(
        inj.decide(&read(5, 1)).is_none(),
        "handled by the bad blocks"
    );
    inj.note_media_error(1, 5);
    inj.note_media_error(2, 5);
    assert_eq!(inj.report()[0].fired, 1);
    inj.clear();
    assert!(inj.is_idle());
    assert!(inj.report().is_empty());
}

/// Catches: a controller that keeps arming without end (a guest reaching
/// the control socket, or OCP entries), a replace that half-happens, or
/// a cap too small for a full OCP Error Injection set.
#[test]
fn armed_specs_are_capped_and_replaced_all_or_nothing() {
    let mut inj = NvmeFaults::default();
    let ocp: Vec<FaultSpec> = (0..crate::admin::OCP_MAX_ENTRIES)
        .map(|_| parse("timeout,opcode=read"))
        .collect();
    let ids = inj.replace(&[], &ocp).unwrap();
    assert_eq!(ids.len(), ocp.len());
    let host = inj.arm(parse("status=0x4")).unwrap();
    let refused = inj.arm(parse("status=0x4")).unwrap_err();
    assert_eq!(refused.cap, MAX_ARMED);
    // One more entry than fits: nothing changes.
    let too_many = vec![parse("cfs"); ocp.len() + 1];
    assert!(inj.replace(&ids, &too_many).is_err());
    assert_eq!(inj.report().len(), MAX_ARMED);
    assert!(inj.report().iter().any(|r| r.spec == "timeout,opcode=read"));
    // A smaller set replaces the old one and keeps the host's spec.
    let fresh = inj.replace(&ids, &[parse("cfs")]).unwrap();
    let specs: Vec<(u64, String)> = inj.report().into_iter().map(|r| (r.id, r.spec)).collect();
    assert_eq!(
        specs,
        vec![
            (host, "status=0x004".to_string()),
            (fresh[0], "cfs,count=1".to_string())
        ]
    );
}
