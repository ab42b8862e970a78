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
