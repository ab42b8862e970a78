//! Tests of `net`: settings precedence and the watchdog on real processes.

use super::*;

fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |k| {
        pairs
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    }
}

#[test]
fn flag_beats_env_beats_manifest_beats_default() {
    let none = NetworkFlags::default();
    let m = ManifestNetwork {
        connect: Some(Duration::from_secs(4)),
        stall: None,
    };
    let d = resolve(&none, &|_| None, &ManifestNetwork::default()).unwrap();
    assert_eq!(d, NetworkSettings::default());
    assert_eq!(d.connect, Duration::from_secs(10));
    assert_eq!(d.stall, Duration::from_secs(30));
    let r = resolve(&none, &|_| None, &m).unwrap();
    assert_eq!(
        (r.connect, r.stall),
        (Duration::from_secs(4), DEFAULT_STALL)
    );
    let env = env_of(&[(CONNECT_ENV, "3s"), (STALL_ENV, "1m")]);
    let r = resolve(&none, &env, &m).unwrap();
    assert_eq!(
        (r.connect, r.stall),
        (Duration::from_secs(3), Duration::from_secs(60))
    );
    let flags = NetworkFlags {
        connect: Some("500ms".into()),
        stall: None,
    };
    let r = resolve(&flags, &env, &m).unwrap();
    assert_eq!(
        (r.connect, r.stall),
        (Duration::from_millis(500), Duration::from_secs(60))
    );
}

#[test]
fn a_setting_that_does_not_parse_is_exit_10_naming_it() {
    let m = ManifestNetwork::default();
    for bad in ["", "0", "0s", "ten", "10 parsecs", "-1s", "1e3", "s", "NaN"] {
        let flags = NetworkFlags {
            connect: Some(bad.into()),
            stall: None,
        };
        let err = resolve(&flags, &|_| None, &m).unwrap_err();
        assert_eq!(crate::exit::code_of(&err), Code::Config, "{bad:?}");
        let msg = err.to_string();
        assert!(
            msg.contains("--connect-timeout") && msg.contains("10s"),
            "{msg}"
        );
        let env = move |k: &str| (k == STALL_ENV).then(|| bad.to_string());
        let err = resolve(&NetworkFlags::default(), &env, &m).unwrap_err();
        assert!(err.to_string().contains(STALL_ENV), "{err}");
    }
    // A bad layer is an error even when a higher one is set.
    let flags = NetworkFlags {
        connect: Some("2s".into()),
        stall: None,
    };
    let env = env_of(&[(CONNECT_ENV, "soon")]);
    assert!(resolve(&flags, &env, &m).is_err());
    let raw: RawNetwork = toml::from_str("connect_timeout = \"x\"").unwrap();
    let err = raw.resolve().unwrap_err();
    assert!(
        err.to_string().contains("[network] connect_timeout"),
        "{err}"
    );
    let raw: RawNetwork = toml::from_str("stall_timeout = 5\nconnect_timeout = \"2s\"").unwrap();
    assert_eq!(
        raw.resolve().unwrap(),
        ManifestNetwork {
            connect: Some(Duration::from_secs(2)),
            stall: Some(Duration::from_secs(5))
        }
    );
    assert!(toml::from_str::<RawNetwork>("connect = \"2s\"").is_err());
}

#[test]
fn durations_show_as_written() {
    assert_eq!(show(Duration::from_secs(10)), "10s");
    assert_eq!(show(Duration::from_millis(500)), "500ms");
    assert_eq!(show(Duration::from_millis(1500)), "1.5s");
}

/// A silent child (a `sleep` that prints nothing) is stopped at the
/// connect deadline, with its whole group.
#[test]
fn a_silent_child_is_stopped_at_the_connect_deadline() {
    let net = NetworkSettings {
        connect: Duration::from_millis(300),
        stall: Duration::from_secs(60),
    };
    let mut c = Command::new("sh");
    c.args(["-c", "sleep 30 & sleep 30; wait"]);
    let ran = run(&mut c, net, None, None, &mut |_| {}, &mut |_| {}).unwrap();
    assert_eq!(ran.stopped, Some(Verdict::Connect(net.connect)));
    assert!(!ran.status.success());
    let err = ran.stopped.unwrap().error("fetch of x", "origin");
    assert!(!format!("{err:#}").contains("running git"), "{err:#}");
    assert_eq!(crate::exit::code_of(&err), Code::Remote);
    assert!(
        err.to_string()
            .starts_with("timed out connecting to origin after 300ms"),
        "{err}"
    );
}

/// A child that printed, then went quiet, stalls; one that keeps printing
/// runs to its end.
#[test]
fn a_child_that_goes_quiet_stalls_and_a_busy_one_does_not() {
    let net = NetworkSettings {
        connect: Duration::from_secs(5),
        stall: Duration::from_millis(400),
    };
    let mut c = Command::new("sh");
    c.args(["-c", "printf 12345; sleep 30"]);
    let ran = run(&mut c, net, None, None, &mut |_| {}, &mut |_| {}).unwrap();
    match ran.stopped {
        Some(Verdict::Stall { bytes: 5, .. }) => {}
        other => panic!("{other:?}"),
    }
    // Busy: a line every 0.1 s, well inside a stall timeout of 1.5 s.
    let net = NetworkSettings {
        stall: Duration::from_millis(1500),
        ..net
    };
    let mut c = Command::new("sh");
    c.args([
        "-c",
        "for i in 1 2 3 4 5 6 7 8 9 10; do echo x >&2; sleep 0.1; done",
    ]);
    let ran = run(&mut c, net, None, None, &mut |_| {}, &mut |_| {}).unwrap();
    assert_eq!(ran.stopped, None);
    assert!(ran.status.success());
}

/// A leader that exits while a process it started holds the pipes: the
/// command is over, its leftover is ended, and nothing is reported stopped.
#[test]
fn processes_left_by_a_finished_leader_are_ended_with_it() {
    let net = NetworkSettings {
        connect: Duration::from_secs(20),
        stall: Duration::from_secs(20),
    };
    let mut c = Command::new("sh");
    c.args(["-c", "echo started; sleep 60 & exit 0"]);
    let ran = run(&mut c, net, None, None, &mut |_| {}, &mut |_| {}).unwrap();
    assert!(ran.status.success());
    assert_eq!(ran.stopped, None);
    assert_eq!(ran.stdout, b"started\n");
}
