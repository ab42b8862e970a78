//! The one glob dialect of `cache-manifests/` (a cache's `include` and
//! `exclude`, gates.toml's `ignore`), and the check that refuses anything
//! outside it instead of letting it silently match nothing.
//!
//! The dialect: `/`-separated paths relative to a root; `*` and `?` match
//! within one component; `**` as a whole component matches any number of
//! components; every other character is literal. Two matchers implement it
//! (`cache::format::manifest::Glob` for packing, git's `:(glob)` pathspec magic for
//! gates, which lets `git status` skip ignored trees itself), and they agree
//! on exactly this subset. Brackets, braces, negation, escapes, a trailing
//! `/`, and empty, `.` or `..` components are refused here, so no pattern
//! means one thing to one matcher and another (or nothing) to the other.

/// The accepted forms, for error messages and the README.
pub const GLOB_FORMS: &str = "relative `/`-separated paths where `*` and `?` match within one component and `**` (a whole component) matches any depth, e.g. `bin/*`, `lib/**/*.so`, `**/*.log`";

/// Checks that `pattern` is in the dialect; the error says what is not and
/// what to write instead.
pub fn check(pattern: &str) -> Result<(), String> {
    let refuse = |why: &str| Err(format!("glob `{pattern}` {why}; globs are {GLOB_FORMS}"));
    if pattern.is_empty() {
        return refuse("is empty");
    }
    if pattern.starts_with('/') {
        return refuse("is absolute: write it relative to the root");
    }
    if pattern.starts_with('!') {
        return refuse(
            "starts with `!`, and negation is not supported: list it under `exclude` instead",
        );
    }
    if pattern.ends_with('/') {
        return refuse("ends with `/`: drop it, a directory matches with everything under it");
    }
    if pattern.contains(['[', ']']) {
        return refuse("uses `[...]`, which is not supported: list each name, or use `?`");
    }
    if pattern.contains(['{', '}']) {
        return refuse("uses `{a,b}`, which is not supported: write one pattern per alternative");
    }
    if pattern.contains('\\') {
        return refuse("uses `\\`, and escapes are not supported");
    }
    for component in pattern.split('/') {
        match component {
            "" => return refuse("has an empty component (`//`)"),
            "." | ".." => {
                return refuse("has a `.` or `..` component: it must stay inside the root");
            }
            c if c.contains("**") && c != "**" => {
                return refuse(
                    "uses `**` inside a component: `**` must be a whole component (`a/**/b`), or use `*`",
                );
            }
            _ => {}
        }
    }
    Ok(())
}

/// A checked pattern compiled to a matcher of `/`-separated relative paths:
/// the one implementation of the dialect's meaning that code below
/// `cache::format` (the extractor, the merge) can use. Two patterns are
/// equal when their text is.
#[derive(Clone, Debug)]
pub struct Pattern {
    pub text: String,
    re: regex_lite::Regex,
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Pattern) -> bool {
        self.text == other.text
    }
}

impl Eq for Pattern {}

impl Pattern {
    pub fn new(glob: &str) -> Result<Pattern, String> {
        check(glob)?;
        // `s`: `.` matches a newline too, so a file whose name holds one is
        // selected like any other instead of silently left out.
        let mut re = String::from("(?s)^");
        let mut chars = glob.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '*' if chars.peek() == Some(&'*') => {
                    chars.next();
                    if chars.peek() == Some(&'/') {
                        chars.next();
                        re.push_str("(?:.*/)?");
                    } else {
                        re.push_str(".*");
                    }
                }
                '*' => re.push_str("[^/]*"),
                '?' => re.push_str("[^/]"),
                c => re.push_str(&regex_lite::escape(&c.to_string())),
            }
        }
        re.push('$');
        Ok(Pattern {
            text: glob.to_string(),
            re: regex_lite::Regex::new(&re).map_err(|e| format!("glob {glob:?}: {e}"))?,
        })
    }

    pub fn matches(&self, rel: &str) -> bool {
        self.re.is_match(rel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dialect_is_accepted() {
        for ok in [
            "**",
            "bin",
            "bin/*",
            "lib/**/*.so",
            "**/*.log",
            "a?c",
            "x/**",
            ".hidden/f",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn anything_else_is_refused_with_the_forms() {
        for bad in [
            "", "/abs", "*.{a,b}", "[0-9]*", "!x", "dir/", "a\\*", "a//b", "./a", "a/../b", "..",
            "a**", "**b/c", "***",
        ] {
            let err = check(bad).expect_err(bad);
            assert!(err.contains("lib/**/*.so"), "{bad}: {err}");
            assert!(err.contains(&format!("`{bad}`")), "{bad}: {err}");
        }
    }

    /// Hostile patterns: whatever is accepted here compiles as a cache
    /// glob and holds none of the refused syntax; whatever is refused is
    /// refused by both readers (cache manifests and gates.toml).
    #[test]
    fn generated_patterns_are_accepted_or_refused_consistently() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut r = |n: u64| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        };
        let alphabet: Vec<char> = "ab*?/[]{}!\\.,- ".chars().collect();
        let (mut accepted, mut refused) = (0, 0);
        for _ in 0..20_000 {
            let len = 1 + r(8) as usize;
            let p: String = (0..len)
                .map(|_| alphabet[r(alphabet.len() as u64) as usize])
                .collect();
            let gates = format!("ignore = [{p:?}]\n");
            match check(&p) {
                Ok(()) => {
                    accepted += 1;
                    assert!(!p.contains(['[', ']', '{', '}', '\\']), "{p:?}");
                    assert!(!p.starts_with(['!', '/']) && !p.ends_with('/'), "{p:?}");
                    crate::cache::format::manifest::Glob::new(&p).unwrap();
                    crate::gates::manifest::parse(&gates).unwrap();
                }
                Err(_) => {
                    refused += 1;
                    assert!(
                        crate::cache::format::manifest::Glob::new(&p).is_err(),
                        "{p:?}"
                    );
                    assert!(crate::gates::manifest::parse(&gates).is_err(), "{p:?}");
                }
            }
        }
        assert!(accepted > 1000 && refused > 1000, "{accepted} {refused}");
    }
}
