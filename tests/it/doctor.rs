//! `doctor` against real servers: squid (an authenticating CONNECT proxy
//! that denies one host with 403), nginx over HTTPS with the test CA, a
//! proxy address where nothing listens, and a host `NO_PROXY` sends
//! direct; each must be named for what it is. And the download step's
//! words when its proxy is dead. No secret given in any URL or variable is
//! ever printed (generated cases).

use crate::util::git_daemon::free_port;
use crate::util::rng::Rng;
use crate::util::servers::{GIT_PASSWORD, GIT_USER, Nginx, PROXY_PASSWORD, Squid};
use crate::util::{Run, TestEnv, run};
use serde_json::Value;
use std::process::Command;

use warmstart::restore::doctor::probe::PROXY_VARS;

fn write(path: &std::path::Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn download_step(name: &str, url: &str) -> String {
    format!(
        "[[step]]\nname = \"{name}\"\nkind = \"download\"\nurl = \"{url}\"\nsha256 = \"{}\"\ndest = \"tools/{name}\"\nretries = 0\nconnect_timeout = \"2s\"\nread_timeout = \"2s\"\n\n",
        "0".repeat(64)
    )
}

/// `warmstart <args>` in `work` with no proxy variable but `vars`.
fn ws(env: &TestEnv, args: &[&str], vars: &[(&str, &str)]) -> Run {
    let mut cmd = env.xtask_in("work");
    cmd.args(args);
    for v in PROXY_VARS {
        cmd.env_remove(v);
    }
    for (k, v) in vars {
        cmd.env(k, v);
    }
    run(&mut cmd)
}

fn host_row<'a>(doc: &'a Value, transport: &str, host: &str) -> &'a Value {
    doc["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["transport"] == transport && r["host"] == host)
        .unwrap_or_else(|| panic!("no {transport} row for {host} in {doc:#}"))
}

#[test]
fn doctor_names_a_host_the_proxy_blocks_a_dead_proxy_and_a_host_reached_directly() {
    let env = TestEnv::new();
    env.bare_remote("srv/origin.git");
    let nginx = Nginx::start(&env.join("srv"));
    let squid = Squid::start_denying(&[nginx.port]);
    let dead = free_port();
    env.work_repo("work");
    let origin = nginx.url_with("origin.git", GIT_USER, GIT_PASSWORD);
    env.git("work", ["remote", "add", "origin", &origin]);
    let dead_proxy = format!("http://carol:dead-s3cret@127.0.0.1:{dead}");
    env.git("work", ["config", "http.proxy", &dead_proxy]);
    let p = nginx.port;
    write(
        &env.join("work/cache-manifests/restore.toml"),
        &(download_step(
            "blocked",
            &format!("https://127.0.0.1:{p}/tool?token=tok-s3cret"),
        ) + &download_step("direct", &format!("https://localhost:{p}/other"))),
    );
    let ca = nginx.ca.cert.to_str().unwrap().to_string();
    let proxy = squid.proxy_url();
    let vars = [
        ("HTTPS_PROXY", proxy.as_str()),
        ("NO_PROXY", "localhost"),
        ("CURL_CA_BUNDLE", ca.as_str()),
        ("GIT_SSL_CAINFO", ca.as_str()),
    ];
    let flags = ["--connect-timeout", "3s", "--timeout", "10s"];
    let text = ws(&env, &[&["doctor"][..], &flags].concat(), &vars).expect_code(8);
    let out = text.stdout();
    let squid_at = format!("http://127.0.0.1:{}", squid.port);
    let dead_at = format!("http://127.0.0.1:{dead}");
    for want in [
        // The blocked host: the 403 is the proxy's, and said to be.
        format!(
            "127.0.0.1:{p}  https  via proxy {squid_at} (HTTPS_PROXY)  proxy-refused  HTTP/1.1 403 Forbidden (from the proxy)"
        ),
        format!(
            "the proxy {squid_at} refuses this host: ask for it to be allowed, or set NO_PROXY if it is reachable directly"
        ),
        // git's own proxy is dead: named as the proxy, from http.proxy.
        format!("127.0.0.1:{p}  git-https  via proxy {dead_at} (http.proxy)  proxy-down"),
        format!("the proxy {dead_at} (from http.proxy) is down"),
        // NO_PROXY sends localhost direct, and nginx itself answers.
        format!(
            "localhost:{p}  https  direct  answered  HTTP/1.1 401 Unauthorized (from the origin)"
        ),
        "reached directly (NO_PROXY names it)".to_string(),
        "1 reached, 2 not reached".to_string(),
    ] {
        assert!(out.contains(&want), "missing {want:?} in:\n{out}");
    }
    assert!(
        text.stderr().contains("2 of 3 host(s) not reached"),
        "{}",
        text.stderr()
    );
    // squid really was asked, and refused.
    assert!(
        squid.access_log().contains("TCP_DENIED/403"),
        "{}",
        squid.access_log()
    );

    let json = ws(&env, &[&["doctor", "--json"][..], &flags].concat(), &vars).expect_code(8);
    let doc: Value = serde_json::from_str(&json.stdout()).unwrap();
    let blocked = host_row(&doc, "https", "127.0.0.1");
    assert_eq!(blocked["route"], "proxy", "{blocked:#}");
    assert_eq!(blocked["proxy"], squid_at.as_str());
    assert_eq!(blocked["proxy_from"], "HTTPS_PROXY");
    assert_eq!(blocked["result"], "proxy-refused");
    assert_eq!(blocked["status_line"], "HTTP/1.1 403 Forbidden");
    assert_eq!(blocked["status_from"], "proxy");
    assert_eq!(blocked["reached"], false);
    assert_eq!(
        blocked["used_by"],
        serde_json::json!(["step blocked (download)"])
    );
    let down = host_row(&doc, "git-https", "127.0.0.1");
    assert_eq!(down["result"], "proxy-down", "{down:#}");
    assert_eq!(down["proxy"], dead_at.as_str());
    assert_eq!(down["proxy_from"], "http.proxy");
    assert_eq!(down["used_by"], serde_json::json!(["remote origin"]));
    let direct = host_row(&doc, "https", "localhost");
    assert_eq!(direct["route"], "direct", "{direct:#}");
    assert_eq!(direct["no_proxy_from"], "NO_PROXY");
    assert_eq!(direct["result"], "answered");
    assert_eq!(direct["status_line"], "HTTP/1.1 401 Unauthorized");
    assert_eq!(direct["status_from"], "origin");
    assert_eq!(direct["reached"], true);
    assert_eq!(
        (doc["reached"].clone(), doc["not_reached"].clone()),
        (1.into(), 2.into())
    );

    for said in [text.stdout(), text.stderr(), json.stdout(), json.stderr()] {
        for secret in [GIT_PASSWORD, PROXY_PASSWORD, "dead-s3cret", "tok-s3cret"] {
            assert!(!said.contains(secret), "{secret} printed:\n{said}");
        }
    }
    // The host was asked without the remote's credentials.
    assert!(
        !nginx.access_log().contains(GIT_USER),
        "{}",
        nginx.access_log()
    );
}

#[test]
fn restore_download_through_a_dead_proxy_names_the_proxy_and_the_fix() {
    let env = TestEnv::new();
    env.work_repo("work");
    let dead = free_port();
    write(
        &env.join("work/cache-manifests/restore.toml"),
        &download_step("tool", "https://127.0.0.1:9/tool"),
    );
    let proxy = format!("http://bob:pw-s3cret@127.0.0.1:{dead}");
    let r = ws(&env, &["restore"], &[("HTTPS_PROXY", &proxy)]).ok();
    let said = format!("{}{}", r.stdout(), r.stderr());
    assert!(
        said.contains(&format!(
            "the proxy http://127.0.0.1:{dead} (from HTTPS_PROXY) is down"
        )),
        "{said}"
    );
    assert!(
        said.contains("start it, fix HTTPS_PROXY, or add the host to NO_PROXY"),
        "{said}"
    );
    assert!(!said.contains("pw-s3cret"), "{said}");
}

/// A secret that no output can contain by chance: a random core, and
/// characters a userinfo or a query may hold.
fn secret(rng: &mut Rng) -> (String, String) {
    let alnum = b"abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let core: String = (0..14).map(|_| *rng.pick(alnum) as char).collect();
    let decor = [
        "", "~", "!", "$", "%40", "'", "*", "+", ",", ";", "=", "-", "_", ".",
    ];
    let s = format!("{}{core}{}", rng.pick(&decor), rng.pick(&decor));
    (s, core)
}

#[test]
fn doctor_never_prints_a_secret_from_any_url_or_proxy_setting() {
    let env = TestEnv::new();
    env.work_repo("work");
    let mut rng = Rng(0x5eed_d0c7_0123_4567);
    let dead = free_port();
    for case in 0..30 {
        let mut secrets = Vec::new();
        let mut next = |rng: &mut Rng| {
            let (s, core) = secret(rng);
            secrets.push(core);
            s
        };
        // Remotes: password, token as the user name, ssh user.
        let _ = Command::new("git")
            .current_dir(env.join("work"))
            .args(["remote", "remove", "a"])
            .output();
        let _ = Command::new("git")
            .current_dir(env.join("work"))
            .args(["remote", "remove", "b"])
            .output();
        let remote_a = match rng.below(3) {
            0 => format!("https://u:{}@127.0.0.1:{dead}/r.git", next(&mut rng)),
            1 => format!("https://{}@127.0.0.1:{dead}/r.git", next(&mut rng)),
            _ => format!("http://x:{}@localhost:{dead}/r.git", next(&mut rng)),
        };
        let remote_b = format!("ssh://{}@127.0.0.1:{dead}/r.git", next(&mut rng));
        env.git("work", ["remote", "add", "a", &remote_a]);
        env.git("work", ["remote", "add", "b", &remote_b]);
        let param = *rng.pick(&["token", "access_token", "X-Amz-Signature", "sig", "api_key"]);
        let url = format!(
            "https://{}127.0.0.1:{dead}/f?{param}={}",
            if rng.chance(50) {
                format!("d:{}@", next(&mut rng))
            } else {
                String::new()
            },
            next(&mut rng)
        );
        write(
            &env.join("work/cache-manifests/restore.toml"),
            &(download_step("dl", &url)
                + "[[step]]\nname = \"py\"\nkind = \"command\"\nrun = \"pip install -r r.txt\"\ncreates = \"venv\"\n"),
        );
        let proxy_secret = next(&mut rng);
        let proxy = match rng.below(3) {
            0 => format!("http://p:{proxy_secret}@127.0.0.1:{dead}"),
            1 => format!("p:{proxy_secret}@127.0.0.1:{dead}"),
            _ => format!("http://{proxy_secret}@127.0.0.1:{dead}/"),
        };
        let var = *rng.pick(&["HTTPS_PROXY", "https_proxy", "ALL_PROXY"]);
        if rng.chance(50) {
            let git_proxy = format!("http://g:{}@127.0.0.1:{dead}", next(&mut rng));
            env.git("work", ["config", "http.proxy", &git_proxy]);
        } else {
            let _ = Command::new("git")
                .current_dir(env.join("work"))
                .args(["config", "--unset", "http.proxy"])
                .output();
        }
        let index = format!("https://i:{}@127.0.0.1:{dead}/simple", next(&mut rng));
        let vars = [(var, proxy.as_str()), ("PIP_INDEX_URL", index.as_str())];
        let json = rng.chance(50);
        let args: &[&str] = if json {
            &["doctor", "--json", "--connect-timeout", "1s"]
        } else {
            &["doctor", "--connect-timeout", "1s"]
        };
        let r = ws(&env, args, &vars);
        assert_eq!(r.code(), 8, "case {case}: {}{}", r.stdout(), r.stderr());
        let said = format!("{}{}", r.stdout(), r.stderr());
        assert!(said.contains("proxy-down"), "case {case}: {said}");
        for core in &secrets {
            assert!(
                !said.contains(core.as_str()),
                "case {case}: {core} printed:\n{said}"
            );
        }
    }
}

/// The doctor as a step (`kind = "doctor"`) always fails open: git's proxy
/// is dead, yet `restore --strict` goes on and exits 0; the step's row says
/// what the doctor found (`warned`, the dead proxy named in its warning and
/// log, its password never), and the next restore within `interval` is warm
/// without probing. `fail_open = false` on it is refused (exit 10).
#[test]
fn restore_doctor_step_fails_open_on_a_dead_proxy_and_shows_in_the_table() {
    let env = TestEnv::new();
    env.work_repo("work");
    let dead = free_port();
    let proxy = format!("http://carol:dead-s3cret@127.0.0.1:{dead}");
    env.git("work", ["config", "http.proxy", &proxy]);
    env.git(
        "work",
        ["remote", "add", "origin", "https://127.0.0.1:9/origin.git"],
    );
    let plan = |extra: &str| {
        format!(
            "[[step]]\nname = \"network\"\nkind = \"doctor\"\nconnect_timeout = \"1s\"\ntimeout = \"3s\"\n{extra}\n[[step]]\nname = \"after\"\nkind = \"command\"\nrun = \"touch after-marker\"\ncreates = \"after-marker\"\n"
        )
    };
    let toml = env.join("work/cache-manifests/restore.toml");
    write(&toml, &plan(""));
    let r = ws(&env, &["restore", "--strict", "--json"], &[]).ok();
    let doc: Value = serde_json::from_str(&r.stdout()).unwrap();
    let row = |doc: &Value, step: &str| {
        doc["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["step"] == step)
            .cloned()
            .unwrap()
    };
    let net = row(&doc, "network");
    assert_eq!(net["kind"], "doctor", "{doc:#}");
    assert_eq!(net["state"], "warned", "{doc:#}");
    assert_eq!(net["what"], "0 reached, 1 not reached", "{doc:#}");
    let warned = net["warnings"].to_string();
    assert!(
        warned.contains("proxy-down")
            && warned.contains(&format!(
                "the proxy http://127.0.0.1:{dead} (from http.proxy) is down"
            )),
        "{warned}"
    );
    assert_eq!(row(&doc, "after")["state"], "done", "{doc:#}");
    assert_eq!(doc["all_steps_ok"], true, "{doc:#}");
    let log = std::fs::read_to_string(net["log"].as_str().unwrap()).unwrap();
    assert!(log.contains("proxy-down"), "{log}");
    let said = format!("{}{}{log}", r.stdout(), r.stderr());
    assert!(!said.contains("dead-s3cret"), "{said}");

    // Within `interval` (default 1h): warm, from the stamp, in the table.
    let r = ws(&env, &["restore"], &[]).ok();
    let line = r
        .stdout()
        .lines()
        .find(|l| l.starts_with("network "))
        .map(String::from)
        .unwrap_or_else(|| panic!("no doctor row:\n{}", r.stdout()));
    assert!(
        line.contains("doctor")
            && line.contains("warm")
            && line.contains("0 reached, 1 not reached"),
        "{line}"
    );

    // Every run with `interval = "0s"`: the table shows this run's finding.
    write(&toml, &plan("interval = \"0s\"\n"));
    let r = ws(&env, &["restore", "--strict"], &[]).ok();
    let line = r
        .stdout()
        .lines()
        .find(|l| l.starts_with("network "))
        .unwrap()
        .to_string();
    assert!(
        line.contains("warned") && line.contains("1 not reached"),
        "{line}"
    );

    write(&toml, &plan("fail_open = false\n"));
    let r = ws(&env, &["restore"], &[]).expect_code(10);
    assert!(
        r.stderr().contains("a doctor step always fails open"),
        "{}",
        r.stderr()
    );
}

/// Never fails the restore, as a property over generated broken networks:
/// each round gives the clone a few remotes and downloads, each broken its
/// own way (a dead proxy, nothing listening, a name that does not resolve,
/// ssh and git:// to a closed port), and `restore --strict` still exits 0
/// with the doctor's row `warned`, its WHAT counting the hosts not reached,
/// and the step after it done.
#[test]
fn restore_doctor_step_never_fails_a_restore_whatever_the_network() {
    let mut rng = Rng(0xd0c7_0125 ^ 0x9e37);
    for round in 0..4 {
        let env = TestEnv::new();
        env.work_repo("work");
        let dead = free_port();
        let broken = [
            format!("https://127.0.0.1:{dead}/r.git"),
            "https://no-such-host.invalid/r.git".to_string(),
            format!("ssh://git@127.0.0.1:{dead}/r.git"),
            format!("git://127.0.0.1:{dead}/r.git"),
        ];
        let mut vars: Vec<(&str, String)> = Vec::new();
        let n = 1 + rng.below(3);
        for i in 0..n {
            let url = rng.pick(&broken).clone();
            env.git("work", ["remote", "add", &format!("r{i}"), &url]);
        }
        if rng.chance(50) {
            env.git(
                "work",
                ["config", "http.proxy", &format!("http://127.0.0.1:{dead}")],
            );
        }
        let mut plan = String::from(
            "[[step]]\nname = \"network\"\nkind = \"doctor\"\nconnect_timeout = \"1s\"\ntimeout = \"2s\"\n\n",
        );
        if rng.chance(50) {
            plan.push_str(&download_step("tool", "https://127.0.0.1:9/tool").replace(
                "[[step]]\nname = \"tool\"",
                "[[step]]\nname = \"tool\"\nunless = \"true\"",
            ));
            vars.push(("HTTPS_PROXY", format!("http://127.0.0.1:{dead}")));
        }
        plan.push_str(
            "[[step]]\nname = \"after\"\nkind = \"command\"\nrun = \"touch after-marker\"\ncreates = \"after-marker\"\n",
        );
        write(&env.join("work/cache-manifests/restore.toml"), &plan);
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let r = ws(&env, &["restore", "--strict", "--json"], &vars);
        assert_eq!(
            r.code(),
            0,
            "round {round}: {plan}\n{}",
            crate::util::show(&r.out)
        );
        let doc: Value = serde_json::from_str(&r.stdout()).unwrap();
        let steps = doc["steps"].as_array().unwrap();
        let net = steps.iter().find(|s| s["step"] == "network").unwrap();
        assert_eq!(net["state"], "warned", "round {round}: {doc:#}");
        assert!(
            net["what"].as_str().unwrap().ends_with(" not reached")
                && !net["what"].as_str().unwrap().contains(" 0 not reached"),
            "round {round}: {doc:#}"
        );
        let after = steps.iter().find(|s| s["step"] == "after").unwrap();
        assert_eq!(after["state"], "done", "round {round}: {doc:#}");
    }
}
