//! Plans built from manifest text: every kind resolves with its defaults, and
//! each bad value is refused with the step and the field named.

use super::*;
use crate::exit::code_of;
use crate::restore::steps::service::Ready;

fn repo() -> Repo {
    Repo {
        root: PathBuf::from("/r"),
        git_dir: PathBuf::from("/r/.git"),
    }
}

fn plan(text: &str) -> Result<Plan> {
    parse(&repo(), Path::new("restore.toml"), text)
}

fn err(text: &str) -> String {
    let e = plan(text).unwrap_err();
    assert_eq!(code_of(&e), Code::Config, "{e:#}");
    let msg = format!("{e:#}");
    assert!(!msg.contains('\n'), "one line: {msg}");
    msg
}

#[test]
fn every_kind_resolves_with_defaults() {
    let p = plan(
        &r#"
[[step]]
name = "bin"
kind = "cache"
cache = "xtask-bin"

[[step]]
name = "suites"
kind = "submodules"
paths = ["vendor/a/", "vendor/b"]
sentinel = [{ suite = "a", path = "vendor/a/run.sh", breaks = "make test-a" }]

[[step]]
name = "skills"
kind = "links"
source = "skills"
farm = ".claude/skills"
index = "skills/INDEX.md"
entries = "dirs"

[[step]]
name = "deps"
kind = "command"
run = ["npm", "ci"]
creates = "node_modules"

[[step]]
name = "tool"
kind = "download"
url = "https://example.org/tool"
sha256 = "SHA"
dest = "bin/tool"
executable = true
read_timeout = "2s"
backoff = 0

[[step]]
name = "python"
kind = "pin"
tool = "python3"
expect = '^Python 3\.1[12]'
fix = { symlink = "bin/python3", target = "/usr/bin/python3.11" }

[[step]]
name = "fresh"
kind = "freshness"
background = true
timeout = "500ms"

[[step]]
name = "lsp"
kind = "service"
run = ["lsp", "--port", "7070"]
ready_port = 7070
watch = ["bin/lsp"]

[[step]]
name = "network"
kind = "doctor"
"#
        .replace("SHA", &"AB".repeat(32)),
    )
    .unwrap();
    let names: Vec<_> = p.steps.iter().map(|s| s.kind_name()).collect();
    assert_eq!(names, KINDS);
    let Kind::Submodules(s) = &p.steps[1].kind else {
        panic!()
    };
    assert_eq!(s.paths, ["vendor/a", "vendor/b"]);
    assert_eq!(s.sentinels[0].abs, Path::new("/r/vendor/a/run.sh"));
    let Kind::Download(d) = &p.steps[4].kind else {
        panic!()
    };
    assert_eq!(d.sha256, "ab".repeat(32));
    assert_eq!(d.dest, Path::new("/r/bin/tool"));
    assert_eq!(d.read_timeout, Duration::from_secs(2));
    assert_eq!(d.connect_timeout, Duration::from_secs(10));
    assert_eq!(d.backoff, Duration::ZERO);
    assert_eq!(d.retries, 3);
    let Kind::Pin(pin) = &p.steps[5].kind else {
        panic!()
    };
    assert!(pin.expect.is_match("Python 3.11.2"));
    assert_eq!(pin.args, ["--version"]);
    assert!(p.steps[6].background && p.steps[6].fail_open);
    let Kind::Freshness(f) = &p.steps[6].kind else {
        panic!()
    };
    assert_eq!(f.timeout, Duration::from_millis(500));
    assert_eq!(p.steps[2].source(&repo()), "skills -> .claude/skills");
    let d = p.steps[3].describe(&repo());
    assert_eq!(d["detail"]["creates"], "/r/node_modules");
    let Kind::Cache(c) = &p.steps[0].kind else {
        panic!()
    };
    assert_eq!((c.cache.as_str(), c.remote.as_deref()), ("xtask-bin", None));
    // No manifest under /r: the source names the file the step needs.
    assert_eq!(p.steps[0].source(&repo()), "cache-manifests/xtask-bin.toml");
    let Kind::Doctor(doc) = &p.steps[8].kind else {
        panic!()
    };
    assert_eq!(doc.interval, Duration::from_secs(3600));
    assert_eq!((doc.connect_timeout, doc.timeout), (None, None));
    assert_eq!(p.steps[8].source(&repo()), "doctor --json");
    assert_eq!(p.slow_uncached, Some(Duration::from_secs(600)));
}

#[test]
fn cache_steps_and_package_downloads_are_checked() {
    let m = err("[[step]]\nname = \"c\"\nkind = \"cache\"\n");
    assert!(m.contains("cache"), "{m}");
    let m = err("[[step]]\nname = \"c\"\nkind = \"cache\"\ncache = \"../x\"\n");
    assert!(m.contains("must name a manifest"), "{m}");
    let m = err("[[step]]\nname = \"c\"\nkind = \"cache\"\ncache = \"gates\"\n");
    assert!(m.contains("reserved"), "{m}");
    let dl = |dest: &str, extra: &str| {
        format!(
            "[[step]]\nname = \"d\"\nkind = \"download\"\nurl = \"https://e.org/p\"\nsha256 = \"{}\"\ndest = \"{dest}\"\n{extra}",
            "0".repeat(64)
        )
    };
    let m = err(&dl("dl/p.conda", "only = [\"bin/\"]\n"));
    assert!(m.contains("`only` needs `unpack_into`"), "{m}");
    let m = err(&dl("dl/p.zip", "unpack_into = \"opt\"\n"));
    assert!(m.contains("must end in .conda"), "{m}");
    let m = err(&dl(
        "dl/p.conda",
        "unpack_into = \"opt\"\nonly = [\"../bin\"]\n",
    ));
    assert!(m.contains("inside the package"), "{m}");
    let p = plan(&dl(
        "dl/p.conda",
        "unpack_into = \"opt\"\nonly = [\"bin/\"]\n",
    ))
    .unwrap();
    let Kind::Download(d) = &p.steps[0].kind else {
        panic!()
    };
    assert_eq!(d.unpack_into.as_deref(), Some(Path::new("/r/opt")));
    assert_eq!(d.only, ["bin/"]);
}

#[test]
fn bad_manifests_are_refused_with_the_step_named() {
    let m = err("[[step]]\nname = \"x\"\nkind = \"teleport\"\n");
    assert!(
        m.contains("step 1 (\"x\")") && m.contains("unknown kind"),
        "{m}"
    );
    let m =
        err("[[step]]\nname = \"x\"\nkind = \"links\"\nsource = \"a\"\nfarm = \"b\"\nfarn = 1\n");
    assert!(m.contains("farn"), "{m}");
    let m = err("[[step]]\nname = \"x\"\nkind = \"command\"\nrun = \"make\"\n");
    assert!(m.contains("`creates`"), "{m}");
    let m = err("[[step]]\nname = \"bad name\"\nkind = \"command\"\n");
    assert!(m.contains("letters, digits"), "{m}");
    let m = err("[[step]]\nkind = \"command\"\n");
    assert!(m.contains("step 1: `name` is missing"), "{m}");
    let two = "[[step]]\nname = \"a\"\nkind = \"freshness\"\n";
    let m = err(&format!("{two}{two}"));
    assert!(m.contains("two steps are named \"a\""), "{m}");
    assert!(err("").contains("no steps"));
    assert!(err("[defaults]\nx = 1\n").contains("unknown top-level key `defaults`"));
    assert!(err("[[step]\n").contains("not valid TOML"));
    let m = err("[[step]]\nname = \"p\"\nkind = \"pin\"\ntool = \"x\"\nexpect = \"(\"\n");
    assert!(m.contains("not a valid pattern"), "{m}");
    let m = err(
        "[[step]]\nname = \"p\"\nkind = \"pin\"\ntool = \"x\"\nexpect = \"x\"\nfix = { symlink = \"a\" }\n",
    );
    assert!(m.contains("`fix` must be either"), "{m}");
    let m = err("[[step]]\nname = \"s\"\nkind = \"submodules\"\npaths = [\"../escape\"]\n");
    assert!(m.contains("inside the repository"), "{m}");
    let m = err("[[step]]\nname = \"f\"\nkind = \"freshness\"\ntimeout = \"soon\"\n");
    assert!(m.contains("not a duration"), "{m}");
}

#[test]
fn service_steps_resolve_and_refuse_what_they_do_not_understand() {
    let svc = |extra: &str| format!("[[step]]\nname = \"lsp\"\nkind = \"service\"\n{extra}");
    let p = plan(&svc(
        "run = \"exec lsp\"\nready_cmd = \"lsp --ping\"\nwatch = [\"~/x\"]\n",
    ))
    .unwrap();
    let Kind::Service(s) = &p.steps[0].kind else {
        panic!()
    };
    assert_eq!(
        s.pidfile,
        Path::new("/r/.git/warmstart/restore/services/lsp.pid")
    );
    assert_eq!(s.log, Path::new("/r/.git/warmstart/logs/lsp.service.log"));
    assert_eq!(
        (s.ready_timeout, s.kill_grace),
        (Duration::from_secs(10), Duration::from_secs(5))
    );
    assert!(matches!(&s.ready, Some(Ready::Cmd(c)) if c.display() == "lsp --ping"));
    assert_eq!(s.cwd, Path::new("/r"));
    assert_eq!(
        p.steps[0].describe(&repo())["detail"]["ready_cmd"],
        "lsp --ping"
    );
    let m = err(&svc("run = \"x\"\nready_port = 70000\n"));
    assert!(m.contains("`ready_port` = 70000 is not a TCP port"), "{m}");
    let m = err(&svc("run = \"x\"\nready_port = 0\n"));
    assert!(m.contains("not a TCP port"), "{m}");
    let m = err(&svc("run = \"x\"\nready_port = 1\nready_cmd = \"y\"\n"));
    assert!(m.contains("keep one"), "{m}");
    let m = err(&svc("run = \"x\"\nreadiness = 1\n"));
    assert!(
        m.contains("step 1") && m.contains("unknown field `readiness`"),
        "{m}"
    );
    let m = err(&svc("run = []\n"));
    assert!(m.contains("`run` is empty"), "{m}");
    let m = err(&svc("run = \"x\"\npidfile = \"a\"\nlog = \"a\"\n"));
    assert!(m.contains("same file"), "{m}");
    let m = err(&svc("run = \"x\"\nready_timeout = \"0s\"\n"));
    assert!(m.contains("ready_timeout"), "{m}");
    let m = err(&svc("pidfile = \"a\"\n"));
    assert!(m.contains("run"), "{m}");
}

#[test]
fn downloads_need_https_and_a_real_pin() {
    let step = |url: &str, sha: &str| {
        format!(
            "[[step]]\nname = \"d\"\nkind = \"download\"\nurl = \"{url}\"\nsha256 = \"{sha}\"\ndest = \"bin/x\"\n"
        )
    };
    let good = "0".repeat(64);
    assert!(err(&step("http://example.org/x", &good)).contains("must be https://"));
    assert!(err(&step("ftp://example.org/x", &good)).contains("must be https://"));
    assert!(err(&step("https://example.org/x", "abc")).contains("not 64 hex digits"));
    for ok in [
        "https://example.org/x",
        "http://127.0.0.1:8080/x",
        "http://localhost/x",
        "http://[::1]:9/x",
    ] {
        plan(&step(ok, &good)).unwrap();
    }
    assert!(err(&step("http://127.0.0.1.evil.org/x", &good)).contains("https://"));
}

#[test]
fn retries_unless_and_include_resolve_and_bad_values_name_their_field() {
    let cmd = |extra: &str| {
        format!(
            "[[step]]\nname = \"c\"\nkind = \"command\"\nrun = \"make\"\ncreates = \"x\"\n{extra}"
        )
    };
    let p = plan(&cmd("retries = 2\nbackoff = \"250ms\"\n")).unwrap();
    let Kind::Command(c) = &p.steps[0].kind else {
        panic!()
    };
    assert_eq!(c.retry.retries, 2);
    assert_eq!(c.retry.backoff, Duration::from_millis(250));
    let Kind::Command(c) = &plan(&cmd("")).unwrap().steps[0].kind else {
        panic!()
    };
    assert_eq!(c.retry.retries, 0, "commands are not retried by default");
    for (extra, needle) in [
        (
            "retries = -1\n",
            "`retries` = -1 is not a number of retries",
        ),
        ("retries = 1.5\n", "`retries` = 1.5"),
        ("retries = \"3\"\n", "`retries` = \"3\""),
        ("retries = true\n", "`retries` = a boolean"),
        ("retries = 11\n", "at most 10"),
        ("backoff = \"x\"\n", "backoff"),
        ("backoff = -1\n", "`backoff`"),
    ] {
        let m = err(&cmd(extra));
        assert!(
            m.contains(needle) && m.contains("step 1 (\"c\")"),
            "{extra}: {m}"
        );
    }
    let dl = |extra: &str| {
        format!(
            "[[step]]\nname = \"d\"\nkind = \"download\"\nurl = \"https://e.org/p\"\nsha256 = \"{}\"\ndest = \"bin/p\"\n{extra}",
            "0".repeat(64)
        )
    };
    let p = plan(&dl("unless = [\"wasm-opt\", \"--version\"]\n")).unwrap();
    let Kind::Download(d) = &p.steps[0].kind else {
        panic!()
    };
    assert_eq!(
        d.unless.as_ref().map(Cmdline::display).as_deref(),
        Some("wasm-opt --version")
    );
    assert_eq!(d.retries, 3);
    assert!(err(&dl("unless = \"  \"\n")).contains("`unless` is empty"));
    assert!(err(&dl("unless = 5\n")).contains("`unless`"));
    assert!(err(&dl("retries = -2\n")).contains("`retries` = -2"));
    let links = |extra: &str| {
        format!("[[step]]\nname = \"l\"\nkind = \"links\"\nsource = \"a\"\nfarm = \"b\"\n{extra}")
    };
    let p = plan(&links("include = [\"bin/*\", \"*.sh\"]\n")).unwrap();
    let Kind::Links(l) = &p.steps[0].kind else {
        panic!()
    };
    let texts: Vec<_> = l.include.iter().map(|g| g.text.as_str()).collect();
    assert_eq!(texts, ["bin/*", "*.sh"]);
    assert_eq!(l.include[0].components.len(), 2);
    assert!(l.include[0].components[1].matches("wasm-opt"));
    for (bad, needle) in [
        ("[\"bin/[ab]\"]", "[...]"),
        ("[\"**/x\"]", "`**`"),
        ("[\"a/**\"]", "`**`"),
        ("[\"{a,b}\"]", "{a,b}"),
        ("[\"!x\"]", "negation"),
        ("[\"bin/\"]", "ends with `/`"),
        ("\"bin/*\"", "`include`"),
        ("[1]", "`include`"),
    ] {
        let m = err(&links(&format!("include = {bad}\n")));
        assert!(m.contains(needle) && m.contains("include"), "{bad}: {m}");
    }
}
