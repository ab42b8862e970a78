//! Redaction of credentials in remote URLs and in free text.
//!
//! Secrets stay in git: every remote URL
//! that warmstart prints, puts in JSON or writes to a file goes through
//! `url`, and every message that may quote one (our errors, git's own
//! stderr that we pass on) goes through `text`. Like git's
//! `transport_anonymize_url`, the whole userinfo is dropped, not only the
//! password: a token is often the user name (`https://<token>@host/...`).
//! A query-string secret (`?access_token=...`, `&X-Amz-Signature=...`,
//! any parameter whose name says secret, key, token or password) loses its
//! value the same way, wherever it stands. This module never touches the
//! file system.

/// `url` with any `user[:password]@` of a `scheme://` URL removed
/// (`https://u:p@host/x` -> `https://host/x`). Paths and scp-like
/// `user@host:path` locations carry no password and are kept as they are.
///
/// A whole URL is cut by git's own rule (`credential_from_url`): the
/// authority runs to the first `/`, `?` or `#`, whatever else it holds.
/// Git sends `"`, `\`, `<`, `` ` `` or a space in a userinfo as part of the
/// password, so the free-text rule of `text`, which must stop at quotes,
/// would print the rest of such a password.
pub fn url(url: &str) -> String {
    let Some(i) = url.find("://") else {
        return text(url);
    };
    // A whole URL's query value runs to `&` or `#` only: a quote is a legal
    // character of it, and stopping there would print the rest.
    let whole = |u: &str| text(&redact_query_until(u, |c| "&#".contains(c)));
    let (head, tail) = url.split_at(i + 3);
    let end = tail.find(['/', '?', '#']).unwrap_or(tail.len());
    match tail[..end].rfind('@') {
        Some(at) => format!("{head}{}", whole(&tail[at + 1..])),
        None => whole(url),
    }
}

/// `s` with the userinfo of every `scheme://userinfo@host` in it removed,
/// and the value of every `Authorization:` header and of every secret
/// query parameter (`secret_param`) replaced by `***`.
pub fn text(s: &str) -> String {
    redact_query(&redact_headers(&redact_userinfo(s)))
}

/// Whether a query parameter's name says it holds a secret: the names
/// hosts and object stores use for tokens and signatures, and any name
/// with secret, key, token or password in it (case aside).
fn secret_param(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "access_token",
        "token",
        "private_token",
        "x-amz-signature",
        "sig",
        "signature",
    ]
    .contains(&n.as_str())
        || ["secret", "key", "token", "password", "passwd"]
            .iter()
            .any(|w| n.contains(w))
}

/// The value of every `?name=value` or `&name=value` whose name is a
/// secret's, replaced by `***`. A value runs to whitespace, `&`, `#` or a
/// quote: ending late only redacts more.
fn redact_query(s: &str) -> String {
    redact_query_until(s, |c| c.is_whitespace() || "&#\"'<>`".contains(c))
}

/// `redact_query` with the characters that end a value given.
fn redact_query_until(s: &str, ends: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(['?', '&']) {
        let (head, tail) = rest.split_at(i + 1);
        out.push_str(head);
        let name_end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || "-_.%[]".contains(c)))
            .unwrap_or(tail.len());
        let (name, after) = tail.split_at(name_end);
        if !name.is_empty() && after.starts_with('=') && secret_param(name) {
            let value = &after[1..];
            let end = value.find(|c: char| ends(c)).unwrap_or(value.len());
            out.push_str(name);
            out.push_str("=***");
            rest = &value[end..];
        } else {
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// Characters that end the authority part of a URL quoted in free text.
/// Only those a userinfo can never hold unencoded (RFC 3986 allows
/// sub-delimiters such as `;`, `,`, `'`, `(`): ending early there would
/// leave the rest of a password behind. Ending late only redacts more.
fn ends_authority(c: char) -> bool {
    c.is_whitespace() || "/?#\"<>`\\".contains(c)
}

fn redact_userinfo(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        // A second URL glued on (`...:9)http://u:p@h`) starts a new one.
        let end = tail
            .char_indices()
            .find(|&(i, c)| ends_authority(c) || tail[i..].starts_with("://"))
            .map_or(tail.len(), |(i, _)| i);
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => out.push_str(&authority[at + 1..]),
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

fn redact_headers(s: &str) -> String {
    const NAME: &str = "authorization:";
    let lower = s.to_ascii_lowercase();
    if !lower.contains(NAME) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut pos = 0;
    while let Some(i) = lower[pos..].find(NAME) {
        let start = pos + i + NAME.len();
        out.push_str(&s[pos..start]);
        // The value runs to the end of the line or of a quoted string.
        let end = s[start..]
            .find(['\n', '\r', '\'', '"'])
            .map_or(s.len(), |e| start + e);
        out.push_str(" ***");
        pos = end;
    }
    out.push_str(&s[pos..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_userinfo_like_git() {
        assert_eq!(
            url("https://user:pass@example.com/o/r.git"),
            "https://example.com/o/r.git"
        );
        assert_eq!(
            url("https://tok@example.com:8443/r"),
            "https://example.com:8443/r"
        );
        assert_eq!(url("http://u:p@w@127.0.0.1:9/x"), "http://127.0.0.1:9/x");
        assert_eq!(url("https://example.com/a@b"), "https://example.com/a@b");
        assert_eq!(url("git@github.com:o/r.git"), "git@github.com:o/r.git");
        assert_eq!(url("/srv/origin.git"), "/srv/origin.git");
        assert_eq!(url("ssh://git@host/r"), "ssh://host/r");
    }

    /// Git takes everything before the `@` of the authority as userinfo,
    /// quotes and spaces included; so must a whole URL's redaction.
    #[test]
    fn a_password_with_a_quote_backslash_or_space_is_never_shown_in_a_url() {
        for pass in [
            "pa\"SECRET",
            "pa\\SECRET",
            "pa<SECRET",
            "pa`SECRET",
            "pa SECRET",
            "pa'SECRET",
        ] {
            let u = format!("http://ci:{pass}@127.0.0.1:1/o.git");
            assert_eq!(url(&u), "http://127.0.0.1:1/o.git", "{u}");
        }
        assert_eq!(
            url("https://h/r?next=http://u:p@h2/x"),
            "https://h/r?next=http://h2/x"
        );
    }

    /// A query value may hold a quote or a space: in a whole URL the
    /// secret runs to `&` or `#`, so none of it is shown.
    #[test]
    fn a_query_secret_with_a_quote_is_never_shown_in_a_url() {
        for v in ["x'SECRET", "x\"SECRET", "x<SECRET", "x`SECRET", "x SECRET"] {
            let u = format!("https://h/f?sig={v}&a=1#frag");
            assert_eq!(url(&u), "https://h/f?sig=***&a=1#frag", "{u}");
        }
    }

    #[test]
    fn free_text_is_redacted_everywhere() {
        assert_eq!(
            text("fatal: unable to access 'https://u:p@h/x/': boom; see http://a:b@c"),
            "fatal: unable to access 'https://h/x/': boom; see http://c"
        );
        assert_eq!(
            text("header Authorization: Basic dTpw\nnext"),
            "header Authorization: ***\nnext"
        );
        assert_eq!(text("no url here"), "no url here");
        assert_eq!(
            text("fatal: unable to access 'https://h/r.git/?access_token=ghp_x1&ref=main': 403"),
            "fatal: unable to access 'https://h/r.git/?access_token=***&ref=main': 403"
        );
        assert_eq!(url("https://h/x?a=1&b=2"), "https://h/x?a=1&b=2");
    }

    /// Never: a secret query parameter's value survives, whatever its name
    /// (the listed ones, or any that says secret, key, token or password,
    /// in any case), its place among other parameters, its characters, or
    /// the text around the URL; the host and the other parameters do.
    #[test]
    fn no_query_string_secret_survives_in_hostile_text() {
        let mut rng = Rng(0x51ce_d00d_feed_beef);
        let names = [
            "access_token",
            "token",
            "private_token",
            "X-Amz-Signature",
            "sig",
            "Signature",
            "client_secret",
            "api_key",
            "apiKey",
            "refresh_token",
            "PASSWORD",
            "db_passwd",
            "x-goog-signature-key",
            "SecretId",
        ];
        let plain = ["ref=main", "a=1", "page=2", "q=x%20y"];
        let hosts = ["127.0.0.1:8443", "example.com", "[::1]:9"];
        let before = ["", "fatal: unable to access '", "\"url\": \"", "see ", "("];
        let after = ["", "': 403", "\"", " and more", ")", "#frag", "\n"];
        const SET: &[u8] =
            b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~%+/=:;,!$*()@";
        for _ in 0..5000 {
            let mut value = String::from("S3");
            for _ in 0..(10 + rng.below(30)) {
                value.push(SET[rng.index(SET.len())] as char);
            }
            let name = rng.pick(&names);
            let other = rng.pick(&plain);
            let host = rng.pick(&hosts);
            let query = match rng.below(3) {
                0 => format!("?{name}={value}"),
                1 => format!("?{other}&{name}={value}"),
                _ => format!("?{name}={value}&{other}"),
            };
            let u = format!("https://{host}/o/r.git{query}");
            let msg = format!("{}{u}{}", rng.pick(&before), rng.pick(&after));
            for shown in [text(&msg), url(&u)] {
                assert!(!shown.contains(&value), "{msg:?} -> {shown:?}");
                assert!(
                    shown.contains(host) && shown.contains(other) == query.contains(other),
                    "{msg:?} -> {shown:?}"
                );
                assert!(
                    shown.contains(&format!("{name}=***")),
                    "{msg:?} -> {shown:?}"
                );
            }
        }
    }

    use crate::test_rng::Rng;

    fn secret(rng: &mut Rng) -> String {
        // Everything a userinfo may hold unencoded, `@` and `:` included.
        const SET: &[u8] =
            b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;=%:@";
        let n = 12 + rng.next() % 20;
        let mut s = String::from("Z");
        for _ in 0..n {
            s.push(SET[(rng.next() % SET.len() as u64) as usize] as char);
        }
        s
    }

    /// Never: whatever the surrounding text, scheme, port, path or the
    /// characters in the secret, no userinfo survives, and the host does.
    #[test]
    fn no_secret_survives_in_hostile_text() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let schemes = ["https", "http", "ssh", "git+ssh", "ftp", "HTTPS"];
        let hosts = ["127.0.0.1", "example.com:8443", "[::1]:9", "h"];
        let paths = ["", "/", "/o/r.git", "/a@b/c", "?q=1", "#frag"];
        let before = [
            "",
            "fatal: unable to access '",
            "remote (",
            "\"source\": \"",
            "x ",
        ];
        let after = ["", "'", ")", "\"", ": done\n", " and more", ";next"];
        for _ in 0..5000 {
            let (user, pass) = (secret(&mut rng), secret(&mut rng));
            let userinfo = match rng.next() % 3 {
                0 => user.clone(),
                1 => format!("{user}:{pass}"),
                _ => format!("{user}:{pass}@{user}"),
            };
            let host = rng.pick(&hosts);
            let u = format!(
                "{}://{userinfo}@{host}{}",
                rng.pick(&schemes),
                rng.pick(&paths)
            );
            let msg = format!("{}{u}{}{}", rng.pick(&before), rng.pick(&after), u);
            let out = text(&msg);
            assert!(
                !out.contains(&user) && !out.contains(&pass),
                "{msg:?} -> {out:?}"
            );
            assert!(out.contains(host), "{msg:?} -> {out:?}");
            assert!(!url(&u).contains('@') || url(&u).contains("/a@b"), "{u}");
        }
    }

    /// Never, for a whole URL: whatever bytes git would take as its
    /// userinfo (quotes, backslashes, spaces, brackets, non-ASCII, `@`, `:`),
    /// none of them is shown, and the host and path are.
    #[test]
    fn no_userinfo_git_would_send_survives_in_a_whole_url() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        const SET: &[char] = &[
            'a', 'Z', '9', '"', '\\', '\'', '`', '<', '>', ' ', '{', '}', '|', '^', '[', ']', '@',
            ':', '%', ';', ',', '(', ')', 'é', '漢', '\t', '!', '$', '&', '*', '+', '=',
        ];
        let hosts = ["127.0.0.1:9", "[::1]:22", "example.com", "h"];
        let tails = ["", "/", "/o/r.git", "?x=1", "#f", "/a@b"];
        for _ in 0..5000 {
            let mut word = String::from("Q");
            for _ in 0..(8 + rng.next() % 16) {
                word.push(SET[(rng.next() % SET.len() as u64) as usize]);
            }
            let (host, tail) = (rng.pick(&hosts), rng.pick(&tails));
            let u = format!(
                "{}://{word}@{host}{tail}",
                rng.pick(&["https", "ssh", "http"])
            );
            let shown = url(&u);
            assert!(!shown.contains(&word), "{u:?} -> {shown:?}");
            assert!(
                shown.ends_with(&format!("{host}{tail}")),
                "{u:?} -> {shown:?}"
            );
        }
    }
}
