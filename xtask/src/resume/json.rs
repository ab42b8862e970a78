//! JSON exactly as JavaScript's `JSON.parse` and `JSON.stringify` see it,
//! for the crash-resume index shared with the JavaScript tool.
//!
//! serde_json cannot be used for the index: JavaScript strings are UTF-16
//! and may hold lone surrogates, which `JSON.stringify` writes as `\udXXX`
//! escapes (valid JSON that serde_json refuses, and that a Rust `String`
//! cannot hold). So strings here are [`Str`], a sequence of UTF-16 code
//! units like a JavaScript string; numbers are doubles, as in JavaScript;
//! objects keep insertion order. Reading and writing back gives the bytes
//! `JSON.stringify(JSON.parse(text), null, 2)` gives, so whatever the
//! JavaScript tool wrote comes back byte for byte. This module is pure text
//! in, text out, and never panics on hostile input (nesting is bounded).

use indexmap::IndexMap;
use std::fmt::{self, Write as _};

/// A JSON object: keys in insertion order, as a JavaScript object built by
/// `JSON.parse` (a repeated key keeps its first position and last value).
pub type Object = IndexMap<Str, Value>;

/// A JSON value as JavaScript holds it.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    /// Every JSON number is a double in JavaScript; `1e400` is Infinity,
    /// which `JSON.stringify` writes as `null`.
    Number(f64),
    String(Str),
    Array(Vec<Value>),
    Object(Object),
}

impl Value {
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Number(n) => Some(*n),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&Str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&Object> {
        match self {
            Value::Object(o) => Some(o),
            _ => None,
        }
    }

    pub fn as_object_mut(&mut self) -> Option<&mut Object> {
        match self {
            Value::Object(o) => Some(o),
            _ => None,
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(Str::from(s))
    }
}

/// A JavaScript string: a sequence of UTF-16 code units, lone surrogates
/// allowed. Held as UTF-8 whenever it is valid Unicode (nearly always, and
/// then it costs what a `String` costs), as code units only when it has a
/// lone surrogate; so two equal strings always have the same form.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Str(Repr);

#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    Text(String),
    /// Holds at least one lone surrogate.
    Units(Vec<u16>),
}

impl Default for Repr {
    fn default() -> Repr {
        Repr::Text(String::new())
    }
}

impl Str {
    /// The string of these UTF-16 code units.
    pub fn from_units(units: Vec<u16>) -> Str {
        match String::from_utf16(&units) {
            Ok(text) => Str(Repr::Text(text)),
            Err(_) => Str(Repr::Units(units)),
        }
    }

    /// The UTF-16 code units, as JavaScript holds them.
    pub fn units(&self) -> Vec<u16> {
        match &self.0 {
            Repr::Text(t) => t.encode_utf16().collect(),
            Repr::Units(u) => u.clone(),
        }
    }

    pub fn is_empty(&self) -> bool {
        matches!(&self.0, Repr::Text(t) if t.is_empty())
    }

    /// The text, or `None` when it has a lone surrogate (which no UTF-8
    /// text, so no argument, path or shell line, can hold).
    pub fn as_text(&self) -> Option<&str> {
        match &self.0 {
            Repr::Text(t) => Some(t),
            Repr::Units(_) => None,
        }
    }

    /// Owned [`Str::as_text`].
    pub fn to_str(&self) -> Option<String> {
        self.as_text().map(str::to_owned)
    }

    /// The code points, a lone surrogate as `Err(unit)`.
    pub fn chars(&self) -> Box<dyn Iterator<Item = Result<char, u16>> + '_> {
        match &self.0 {
            Repr::Text(t) => Box::new(t.chars().map(Ok)),
            Repr::Units(u) => Box::new(
                char::decode_utf16(u.iter().copied())
                    .map(|r| r.map_err(|e| e.unpaired_surrogate())),
            ),
        }
    }

    /// The text for a terminal: control and format characters (which would
    /// drive the terminal or reorder the line) and lone surrogates escaped
    /// as `\u{...}`, everything else verbatim.
    pub fn for_display(&self) -> String {
        let mut out = String::new();
        for c in self.chars() {
            match c {
                Ok(c) if !is_invisible(c) => out.push(c),
                Ok(c) => out.extend(c.escape_default()),
                Err(unit) => {
                    let _ = write!(out, "\\u{{{unit:x}}}");
                }
            }
        }
        out
    }
}

impl From<&str> for Str {
    fn from(s: &str) -> Str {
        Str(Repr::Text(s.to_owned()))
    }
}

impl From<String> for Str {
    fn from(s: String) -> Str {
        Str(Repr::Text(s))
    }
}

impl PartialEq<str> for Str {
    fn eq(&self, other: &str) -> bool {
        self.as_text() == Some(other)
    }
}

impl fmt::Debug for Str {
    /// As Rust quotes a `str` (`"a\u{202e}b"`, control, format and other
    /// invisible characters escaped), a lone surrogate as `\u{d83d}`: exact,
    /// and safe to print on a terminal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(text) = self.as_text() {
            return write!(f, "{text:?}");
        }
        f.write_char('"')?;
        for c in self.chars() {
            match c {
                Ok('\'') => f.write_char('\'')?,
                Ok(c) => write!(f, "{}", c.escape_debug())?,
                Err(unit) => write!(f, "\\u{{{unit:x}}}")?,
            }
        }
        f.write_char('"')
    }
}

/// Unicode's format characters (general category Cf: bidi controls such as
/// U+202E, zero-width characters, U+FEFF), as node's ICU (Unicode 17) has
/// them. They are invisible and can make a line read differently from what
/// it holds.
const FORMAT: &[(u32, u32)] = &[
    (0x00AD, 0x00AD),
    (0x0600, 0x0605),
    (0x061C, 0x061C),
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x180E, 0x180E),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x2064),
    (0x2066, 0x206F),
    (0xFEFF, 0xFEFF),
    (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001),
    (0xE0020, 0xE007F),
];

/// True for a format character (Unicode category Cf).
pub fn is_format(c: char) -> bool {
    let c = c as u32;
    FORMAT.iter().any(|&(lo, hi)| lo <= c && c <= hi)
}

/// True for what must never reach a terminal or shell line unescaped:
/// control characters (Cc), format characters (Cf) and the line and
/// paragraph separators U+2028 and U+2029, which break a line.
pub fn is_invisible(c: char) -> bool {
    c.is_control() || is_format(c) || matches!(c, '\u{2028}' | '\u{2029}')
}

/// Why text is not JSON that `JSON.parse` accepts.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{what} at line {line} column {column}")]
pub struct ParseError {
    pub what: &'static str,
    pub line: usize,
    pub column: usize,
    /// The text ended early: a truncated file rather than a garbled one.
    pub eof: bool,
}

/// How deep arrays and objects may nest: far beyond any index, and small
/// enough that a hostile file cannot exhaust the stack.
pub const MAX_DEPTH: usize = 256;

/// Parses JSON text as `JSON.parse` does (strict JSON: no comments, no
/// trailing commas, whitespace is space, tab, LF and CR only). The text
/// must be UTF-8; a byte-order mark is refused, as `JSON.parse` refuses it.
pub fn parse(bytes: &[u8]) -> Result<Value, ParseError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| locate(bytes, e.valid_up_to(), "invalid UTF-8", false))?;
    let mut p = Parser { text, pos: 0 };
    p.skip_ws();
    let value = p.value(0)?;
    p.skip_ws();
    if p.pos < text.len() {
        return Err(p.error("trailing characters after the JSON value"));
    }
    Ok(value)
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

/// What one escape in a string stands for.
enum Unit {
    Char(char),
    /// A surrogate that is not half of a pair.
    Lone(u16),
}

/// A parse error at byte `pos`, with its line and column (in characters).
fn locate(bytes: &[u8], pos: usize, what: &'static str, eof: bool) -> ParseError {
    let before = &bytes[..pos];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let column = String::from_utf8_lossy(&before[start..]).chars().count() + 1;
    ParseError {
        what,
        line,
        column,
        eof,
    }
}

impl Parser<'_> {
    fn error(&self, what: &'static str) -> ParseError {
        let eof = self.pos >= self.text.len();
        let what = if eof {
            "unexpected end of the text"
        } else {
            what
        };
        locate(
            self.text.as_bytes(),
            self.pos.min(self.text.len()),
            what,
            eof,
        )
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        // A plain loop: the index is indented, so this runs over a third of
        // its bytes, unoptimised in the dev profile.
        let bytes = self.text.as_bytes();
        let mut pos = self.pos;
        while pos < bytes.len() && matches!(bytes[pos], b' ' | b'\t' | b'\n' | b'\r') {
            pos += 1;
        }
        self.pos = pos;
    }

    fn expect(&mut self, byte: u8, what: &'static str) -> Result<(), ParseError> {
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.error(what))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, ParseError> {
        match self.peek() {
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => self.string().map(Value::String),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.word("true", Value::Bool(true)),
            Some(b'f') => self.word("false", Value::Bool(false)),
            Some(b'n') => self.word("null", Value::Null),
            _ => Err(self.error("expected a JSON value")),
        }
    }

    fn word(&mut self, word: &'static str, value: Value) -> Result<Value, ParseError> {
        let rest = &self.text[self.pos..];
        if rest.starts_with(word) {
            self.pos += word.len();
            Ok(value)
        } else if word.starts_with(rest) {
            self.pos = self.text.len();
            Err(self.error("unexpected end of the text"))
        } else {
            Err(self.error("expected a JSON value"))
        }
    }

    fn nest(&self, depth: usize) -> Result<(), ParseError> {
        if depth > MAX_DEPTH {
            return Err(self.error("arrays and objects nested more than 256 deep"));
        }
        Ok(())
    }

    fn array(&mut self, depth: usize) -> Result<Value, ParseError> {
        self.nest(depth)?;
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth)?);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                _ => return Err(self.error("expected ',' or ']' in an array")),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, ParseError> {
        self.nest(depth)?;
        self.pos += 1;
        let mut map = Object::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Value::Object(map));
        }
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return Err(self.error("expected a string key in an object"));
            }
            let key = self.string()?;
            self.skip_ws();
            self.expect(b':', "expected ':' after an object key")?;
            self.skip_ws();
            let value = self.value(depth)?;
            // A repeated key keeps its first position and takes the last
            // value, as JSON.parse does.
            map.insert(key, value);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(map));
                }
                _ => return Err(self.error("expected ',' or '}' in an object")),
            }
        }
    }

    fn string(&mut self) -> Result<Str, ParseError> {
        self.pos += 1;
        let text = self.text;
        let mut out = String::new();
        // Code units instead of `out`, from the first lone surrogate on.
        let mut units: Option<Vec<u16>> = None;
        loop {
            let rest = &text.as_bytes()[self.pos..];
            // memchr is built optimised even in the dev profile that
            // `cargo xtask` runs; a byte-by-byte search here would not be.
            let run = memchr::memchr2(b'"', b'\\', rest).unwrap_or(rest.len());
            if let Some(at) = rest[..run].iter().position(|&b| b < 0x20) {
                self.pos += at;
                return Err(self.error("a control character inside a string"));
            }
            // The run ends at an ASCII byte (or the end), so on a boundary.
            let chunk = &text[self.pos..self.pos + run];
            match &mut units {
                Some(units) => units.extend(chunk.encode_utf16()),
                None => out.push_str(chunk),
            }
            self.pos += run;
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(match units {
                        Some(units) => Str::from_units(units),
                        None => Str::from(out),
                    });
                }
                Some(b'\\') => {
                    self.pos += 1;
                    match (self.escape()?, &mut units) {
                        (Unit::Char(c), Some(units)) => {
                            units.extend_from_slice(c.encode_utf16(&mut [0; 2]));
                        }
                        (Unit::Char(c), None) => out.push(c),
                        (Unit::Lone(unit), units) => units
                            .get_or_insert_with(|| out.encode_utf16().collect())
                            .push(unit),
                    }
                }
                _ => return Err(self.error("unexpected end of the text")),
            }
        }
    }

    /// One escape after the backslash. `\uD83D\uDE00` (two escapes making a
    /// pair) is one character, exactly as in JavaScript; a surrogate escape
    /// that is not half of such a pair is a lone surrogate.
    fn escape(&mut self) -> Result<Unit, ParseError> {
        let short = match self.peek() {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                self.pos += 1;
                let unit = self.hex4()?;
                if (0xD800..0xDC00).contains(&unit) && self.text[self.pos..].starts_with("\\u") {
                    let high = self.pos;
                    self.pos += 2;
                    match self.hex4() {
                        Ok(low) if (0xDC00..0xE000).contains(&low) => {
                            let c = 0x10000
                                + ((u32::from(unit) - 0xD800) << 10)
                                + (u32::from(low) - 0xDC00);
                            return Ok(Unit::Char(
                                char::from_u32(c).expect("a surrogate pair is a char"),
                            ));
                        }
                        // Not a low half: the next escape is read on its own
                        // (and a bad one fails there, with its own position).
                        _ => self.pos = high,
                    }
                }
                return Ok(match char::from_u32(u32::from(unit)) {
                    Some(c) => Unit::Char(c),
                    None => Unit::Lone(unit),
                });
            }
            _ => return Err(self.error("an unknown escape in a string")),
        };
        self.pos += 1;
        Ok(Unit::Char(short))
    }

    /// The four hex digits of a `\u` escape, as a code unit.
    fn hex4(&mut self) -> Result<u16, ParseError> {
        let hex = self.text.get(self.pos..self.pos + 4);
        let unit = hex
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|h| u16::from_str_radix(h, 16).ok());
        match unit {
            Some(unit) => {
                self.pos += 4;
                Ok(unit)
            }
            None if self.text.len() < self.pos + 4
                && self.text.as_bytes()[self.pos..]
                    .iter()
                    .all(u8::is_ascii_hexdigit) =>
            {
                self.pos = self.text.len();
                Err(self.error("unexpected end of the text"))
            }
            None => Err(self.error("a \\u escape without four hex digits")),
        }
    }

    fn number(&mut self) -> Result<Value, ParseError> {
        let start = self.pos;
        let text = self.text;
        let bytes = text.as_bytes();
        let digits = |pos: &mut usize| {
            let from = *pos;
            while bytes.get(*pos).is_some_and(u8::is_ascii_digit) {
                *pos += 1;
            }
            *pos - from
        };
        let mut pos = self.pos;
        if bytes.get(pos) == Some(&b'-') {
            pos += 1;
        }
        let int_start = pos;
        let int = digits(&mut pos);
        let bad = |p: &mut Self, pos: usize, what| {
            p.pos = pos;
            Err(p.error(what))
        };
        if int == 0 {
            return bad(self, pos, "expected a digit in a number");
        }
        if int > 1 && bytes[int_start] == b'0' {
            return bad(self, int_start + 1, "a number with a leading zero");
        }
        if bytes.get(pos) == Some(&b'.') {
            pos += 1;
            if digits(&mut pos) == 0 {
                return bad(self, pos, "expected a digit after the decimal point");
            }
        }
        if matches!(bytes.get(pos), Some(b'e' | b'E')) {
            pos += 1;
            if matches!(bytes.get(pos), Some(b'+' | b'-')) {
                pos += 1;
            }
            if digits(&mut pos) == 0 {
                return bad(self, pos, "expected a digit in the exponent");
            }
        }
        self.pos = pos;
        // Rust's parse is correctly rounded, as JavaScript's is; a magnitude
        // past f64 is infinite, as in JavaScript.
        let n: f64 = text[start..pos]
            .parse()
            .expect("the JSON number grammar is a subset of Rust's");
        Ok(Value::Number(n))
    }
}

/// `JSON.stringify(value, null, 2)`.
pub fn to_pretty(value: &Value) -> String {
    let mut out = String::with_capacity(256);
    write_value(&mut out, value, Some(0));
    out
}

/// `JSON.stringify(object, null, 2)`, without wrapping it in a `Value`.
pub fn object_to_pretty(object: &Object) -> String {
    let mut out = String::with_capacity(256);
    write_object(&mut out, object, Some(0));
    out
}

/// `JSON.stringify(value)`.
pub fn to_compact(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value, None);
    out
}

/// A new line at `depth` (pretty) or nothing (compact).
fn newline(out: &mut String, depth: Option<usize>) {
    if let Some(depth) = depth {
        out.push('\n');
        for _ in 0..depth {
            out.push_str("  ");
        }
    }
}

fn write_value(out: &mut String, value: &Value, depth: Option<usize>) {
    let inner = depth.map(|d| d + 1);
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&js_number(*n)),
        Value::String(s) => quote(out, s),
        Value::Array(items) if items.is_empty() => out.push_str("[]"),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(out, inner);
                write_value(out, item, inner);
            }
            newline(out, depth);
            out.push(']');
        }
        Value::Object(map) => write_object(out, map, depth),
    }
}

fn write_object(out: &mut String, map: &Object, depth: Option<usize>) {
    if map.is_empty() {
        out.push_str("{}");
        return;
    }
    let inner = depth.map(|d| d + 1);
    out.push('{');
    for (i, (key, item)) in js_key_order(map).into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        newline(out, inner);
        quote(out, key);
        out.push_str(if depth.is_some() { ": " } else { ":" });
        write_value(out, item, inner);
    }
    newline(out, depth);
    out.push('}');
}

/// A string as JSON.stringify quotes it (ES2019 well-formed stringify):
/// `"` and `\` escaped, `\b \f \n \r \t` short, other control characters
/// and lone surrogates as lowercase `\uXXXX`, everything else verbatim
/// (U+2028, DEL and non-ASCII included).
fn quote(out: &mut String, s: &Str) {
    out.push('"');
    match s.as_text() {
        Some(text) => {
            // Runs that need no escape are copied whole.
            let mut from = 0;
            for (i, &b) in text.as_bytes().iter().enumerate() {
                if b < 0x20 || b == b'"' || b == b'\\' {
                    out.push_str(&text[from..i]);
                    escape_into(out, char::from(b));
                    from = i + 1;
                }
            }
            out.push_str(&text[from..]);
        }
        None => {
            for c in s.chars() {
                match c {
                    Ok(c) if (c as u32) < 0x20 || c == '"' || c == '\\' => escape_into(out, c),
                    Ok(c) => out.push(c),
                    Err(unit) => {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
            }
        }
    }
    out.push('"');
}

/// The escape JSON.stringify writes for `"`, `\` or a control character.
fn escape_into(out: &mut String, c: char) {
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        '\u{8}' => out.push_str("\\b"),
        '\u{c}' => out.push_str("\\f"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c => {
            let _ = write!(out, "\\u{:04x}", c as u32);
        }
    }
}

/// JavaScript enumerates an object's array-index keys ("0" to "4294967294",
/// no leading zeros) first, in ascending numeric order, then the other keys
/// in insertion order. JSON.stringify follows that order.
fn js_key_order(map: &Object) -> Vec<(&Str, &Value)> {
    let index_of = |k: &Str| -> Option<u32> {
        // A key with a lone surrogate is no number.
        let k = k.as_text()?;
        let canonical = k == "0" || (!k.starts_with('0') && k.bytes().all(|b| b.is_ascii_digit()));
        if !canonical || k.is_empty() || k.len() > 10 {
            return None;
        }
        k.parse::<u32>().ok().filter(|&n| n != u32::MAX)
    };
    let mut indexed: Vec<_> = map
        .iter()
        .filter_map(|(k, v)| index_of(k).map(|n| (n, k, v)))
        .collect();
    indexed.sort_by_key(|(n, _, _)| *n);
    indexed
        .into_iter()
        .map(|(_, k, v)| (k, v))
        .chain(map.iter().filter(|(k, _)| index_of(k).is_none()))
        .collect()
}

/// A number as JavaScript prints it (Number::toString): integers without a
/// fraction, large or tiny magnitudes as `e+NN` / `e-NN`, -0 as 0, and
/// Infinity (which JSON cannot hold) as null.
pub fn js_number(x: f64) -> String {
    if !x.is_finite() {
        return "null".into();
    }
    if x == 0.0 {
        return "0".into();
    }
    // Rust's `{:e}` gives the shortest digits that round-trip, like JS.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let k = digits.len() as i64;
    let n = exp.parse::<i64>().expect("{:e} exponent is an integer") + 1;
    let mut out = String::new();
    if x < 0.0 {
        out.push('-');
    }
    if k <= n && n <= 21 {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.push_str(&digits[..n as usize]);
        out.push('.');
        out.push_str(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(&digits);
    } else {
        out.push_str(&digits[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = n - 1;
        let _ = write!(out, "e{}{}", if e >= 0 { "+" } else { "-" }, e.abs());
    }
    out
}

#[cfg(test)]
mod tests;
