//! Publish refuses what restore refuses: an absolute or escaping symlink in the pack root is exit 7 at publish, in restore's words, before anything is pushed.
//!
//! Before, a venv's `sitecustomize.py` linked to a file in /etc was
//! published without complaint, and every restore of that key then refused
//! it with exit 7.

use crate::util::fixture::{Fixture, Manifest};
use crate::util::{run, show};
use std::os::unix::fs::symlink;

fn with_link(link: &str, target: &str) -> Fixture {
    let fx = Fixture::new();
    let src = fx.env.join("src");
    std::fs::create_dir_all(src.join("lib/site")).unwrap();
    std::fs::write(src.join("lib/site/real.py"), "x = 1\n").unwrap();
    symlink(target, src.join(link)).unwrap();
    fx.write_manifest("art", &Manifest::literal("1", &src));
    fx
}

/// Nothing of the cache reached the remote.
fn assert_nothing_pushed(fx: &Fixture) {
    let refs = fx.origin_git(&["for-each-ref", "--format=%(refname)"]);
    assert!(!refs.contains("art"), "pushed: {refs}");
}

#[test]
fn cache_publish_entries_an_absolute_symlink_is_refused_in_restores_words_before_any_push() {
    let fx = with_link("lib/site/sitecustomize.py", "/etc/hostname");
    for args in [
        &["cache", "publish", "art"][..],
        &["cache", "publish", "art", "--dry-run"][..],
    ] {
        let r = run(&mut fx.command(args));
        assert_eq!(r.code(), 7, "{args:?}: {}", show(&r.out));
        assert!(
            r.stderr().contains(
                "refusing tar entry `lib/site/sitecustomize.py`: symlink to the absolute path `/etc/hostname` leaves the destination"
            ),
            "{args:?}: {}",
            show(&r.out)
        );
        assert_eq!(r.stderr().trim().lines().count(), 1, "{}", show(&r.out));
    }
    assert_nothing_pushed(&fx);
}

#[test]
fn cache_publish_entries_a_symlink_climbing_out_of_the_root_is_refused_a_relative_one_inside_is_published()
 {
    let fx = with_link("lib/up", "../../outside");
    let r = run(&mut fx.command(&["cache", "publish", "art"]));
    assert_eq!(r.code(), 7, "{}", show(&r.out));
    assert!(
        r.stderr().contains(
            "refusing tar entry `lib/up`: symlink target `../../outside` leaves the destination"
        ),
        "{}",
        show(&r.out)
    );
    assert_nothing_pushed(&fx);

    let fx = with_link("lib/inside", "site/real.py");
    fx.publish("art");
    fx.forget();
    fx.restore("art");
    assert_eq!(
        std::fs::read_link(fx.work.join("restored/art/lib/inside")).unwrap(),
        std::path::PathBuf::from("site/real.py")
    );
}

/// A venv-like tree whose `bin/python` links to the system interpreter.
fn venv(fx: &Fixture) -> std::path::PathBuf {
    let src = fx.env.join("src");
    std::fs::create_dir_all(src.join("venv/bin")).unwrap();
    std::fs::write(src.join("venv/pyvenv.cfg"), "home = /usr/bin\n").unwrap();
    std::fs::write(
        src.join("venv/bin/activate"),
        "# unchanged by the new key\n",
    )
    .unwrap();
    symlink("/usr/bin/python3", src.join("venv/bin/python")).unwrap();
    symlink("python", src.join("venv/bin/python3")).unwrap();
    src
}

const ALLOW_PYTHON: &str = "absolute_symlinks = [\"venv/bin/python*\"]";
const PYTHON_REFUSED: &str = "refusing tar entry `venv/bin/python`: symlink to the absolute path `/usr/bin/python3` leaves the destination";

fn assert_python_link(dir: &std::path::Path) {
    assert_eq!(
        std::fs::read_link(dir.join("venv/bin/python")).unwrap(),
        std::path::PathBuf::from("/usr/bin/python3")
    );
    assert_eq!(
        std::fs::read_link(dir.join("venv/bin/python3")).unwrap(),
        std::path::PathBuf::from("python")
    );
}

#[test]
fn cache_publish_entries_pack_absolute_symlinks_publishes_and_restores_a_venv_python_link_and_without_it_both_refuse()
 {
    let fx = Fixture::new();
    let src = venv(&fx);
    fx.write_manifest("art", &Manifest::literal("1", &src));
    let r = run(&mut fx.command(&["cache", "publish", "art"]));
    assert_eq!(r.code(), 7, "{}", show(&r.out));
    assert!(r.stderr().contains(PYTHON_REFUSED), "{}", show(&r.out));
    assert_nothing_pushed(&fx);

    // With the setting: packed, and restored cold (replace) and by merge.
    let allowed = Manifest::literal("1", &src).pack_line(ALLOW_PYTHON);
    fx.write_manifest("art", &allowed);
    fx.publish("art");
    fx.forget();
    fx.restore("art");
    assert_python_link(&fx.work.join("restored/art"));
    // A new key over that install goes by the delta install, which keeps it.
    std::fs::write(src.join("venv/pyvenv.cfg"), "home = /usr/local/bin\n").unwrap();
    fx.write_manifest("art", &Manifest::literal("2", &src).pack_line(ALLOW_PYTHON));
    fx.publish("art");
    let j = fx.restore("art");
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["delta_fallback"], serde_json::Value::Null, "{j}");
    assert_eq!(j["files_linked"], 1, "{j}");
    assert_python_link(&fx.work.join("restored/art"));
    fx.write_manifest(
        "art",
        &allowed
            .clone()
            .restore_path("restored/overlay")
            .restore_line("mode = \"overlay\""),
    );
    fx.restore("art");
    assert_python_link(&fx.work.join("restored/overlay"));

    // Without it, restoring that very key refuses the link in publish's words.
    for (path, mode) in [
        ("restored/again", "replace"),
        ("restored/merged", "overlay"),
    ] {
        fx.forget();
        fx.write_manifest(
            "art",
            &Manifest::literal("1", &src)
                .restore_path(path)
                .restore_line(&format!("mode = \"{mode}\"")),
        );
        let r = run(&mut fx.command(&["cache", "restore", "art"]));
        assert_eq!(r.code(), 7, "{mode}: {}", show(&r.out));
        assert!(
            r.stderr().contains(PYTHON_REFUSED),
            "{mode}: {}",
            show(&r.out)
        );
        assert!(
            std::fs::symlink_metadata(fx.work.join(path).join("venv/bin/python")).is_err(),
            "{mode}: installed anyway"
        );
    }
}

#[test]
fn cache_publish_entries_pack_absolute_symlinks_still_refuses_a_dotdot_target_and_an_unmatched_path()
 {
    for (link, target, why) in [
        (
            "venv/bin/evil",
            "/etc/../etc/passwd",
            "refusing tar entry `venv/bin/evil`: symlink to the absolute path `/etc/../etc/passwd` has a `..` component",
        ),
        (
            "other/x",
            "/etc",
            "refusing tar entry `other/x`: symlink to the absolute path `/etc` leaves the destination",
        ),
        (
            "venv/bin/pythonup",
            "../../../outside",
            "refusing tar entry `venv/bin/pythonup`: symlink target `../../../outside` leaves the destination",
        ),
    ] {
        let fx = Fixture::new();
        let src = venv(&fx);
        let dir = src.join(link);
        std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
        symlink(target, &dir).unwrap();
        fx.write_manifest(
            "art",
            &Manifest::literal("1", &src).pack_line("absolute_symlinks = [\"venv/bin/*\"]"),
        );
        let r = run(&mut fx.command(&["cache", "publish", "art"]));
        assert_eq!(r.code(), 7, "{link}: {}", show(&r.out));
        assert!(r.stderr().contains(why), "{link}: {}", show(&r.out));
        assert_nothing_pushed(&fx);
    }
}
