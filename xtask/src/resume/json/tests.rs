//! Tests of JSON as JavaScript holds it: lone surrogates, doubles, ordered objects, and JSON.stringify's bytes.

use super::*;

fn num(text: &str) -> String {
    to_pretty(&parse(text.as_bytes()).unwrap())
}

#[test]
fn numbers_print_as_javascript_does() {
    for (json, js) in [
        ("0", "0"),
        ("-0", "0"),
        ("-0.0", "0"),
        ("1.0", "1"),
        ("1E2", "100"),
        ("1.5", "1.5"),
        ("0.1", "0.1"),
        ("1732934400123", "1732934400123"),
        ("1732934400123.456", "1732934400123.456"),
        ("1e21", "1e+21"),
        ("1.5e300", "1.5e+300"),
        ("1e400", "null"),
        ("-1e400", "null"),
        ("1e-400", "0"),
        ("123456789012345680000", "123456789012345680000"),
        ("9007199254740993", "9007199254740992"),
        ("12345678901234567890", "12345678901234567000"),
        ("0.000001", "0.000001"),
        ("1e-7", "1e-7"),
        ("-2.5e-10", "-2.5e-10"),
        ("-42", "-42"),
    ] {
        assert_eq!(num(json), js, "JSON {json}");
    }
}

#[test]
fn pretty_layout_and_key_order_match_json_stringify() {
    let v = parse(br#"{"b":[],"10":{},"2":[1,{"x":null}],"01":true,"a":"\u00e9\u0001\"\\\/"}"#)
        .unwrap();
    assert_eq!(
        to_pretty(&v),
        "{\n  \"2\": [\n    1,\n    {\n      \"x\": null\n    }\n  ],\n  \"10\": {},\n  \
         \"b\": [],\n  \"01\": true,\n  \"a\": \"é\\u0001\\\"\\\\/\"\n}"
    );
    assert_eq!(
        to_compact(&v),
        r#"{"2":[1,{"x":null}],"10":{},"b":[],"01":true,"a":"é\u0001\"\\/"}"#
    );
    // 4294967295 is not an array index, 4294967294 is.
    let v = parse(br#"{"4294967295":1,"4294967294":2,"0":3,"00":4}"#).unwrap();
    assert_eq!(
        to_compact(&v),
        r#"{"0":3,"4294967294":2,"4294967295":1,"00":4}"#
    );
}

#[test]
fn lone_surrogates_are_kept_and_written_as_json_stringify_does() {
    // What node prints for {a: "x😀".slice(0, 2), b: "\udc00z", ...}.
    let text =
        "{\"a\":\"x\\ud83d\",\"b\":\"\\uDC00z\",\"c\":\"\\ud83d\\ude00\",\"d\":\"\\ude00\\ud83d\"}";
    let v = parse(text.as_bytes()).unwrap();
    assert_eq!(
        to_compact(&v),
        "{\"a\":\"x\\ud83d\",\"b\":\"\\udc00z\",\"c\":\"😀\",\"d\":\"\\ude00\\ud83d\"}"
    );
    let a = v.as_object().unwrap()[&Str::from("a")].as_str().unwrap();
    assert_eq!(a.units(), [u16::from(b'x'), 0xD83D]);
    assert_eq!(a.to_str(), None);
    assert_eq!(a.for_display(), "x\\u{d83d}");
    assert_eq!(format!("{a:?}"), "\"x\\u{d83d}\"");
    assert_eq!(
        format!("{:?}", Str::from("'a\u{202e}\"")),
        "\"'a\\u{202e}\\\"\""
    );
    // A lone surrogate as a key, too.
    let v = parse(b"{\"\\ud800\":1}").unwrap();
    assert_eq!(to_compact(&v), "{\"\\ud800\":1}");
}

#[test]
fn a_string_turning_lone_halfway_keeps_every_unit() {
    // Text, then a lone surrogate (code units from there on), then more
    // text, a pair written as two escapes, a lone low half, and a high
    // escape followed by a non-surrogate escape.
    let v = parse(br#""ab\u00e9\ud83dcd\ud83d\ude00\u00e9\ude00\ud800\u0041""#).unwrap();
    let want: Vec<u16> = [
        &units_of("ab\u{e9}")[..],
        &[0xD83D],
        &units_of("cd\u{1f600}\u{e9}"),
        &[0xDE00, 0xD800, 0x41],
    ]
    .concat();
    assert_eq!(v.as_str().unwrap().units(), want);
    assert_eq!(to_compact(&v), r#""abé\ud83dcd😀é\ude00\ud800A""#);
    // Valid after all: the same form as the text, so equal and hashed alike.
    let v = parse(br#""\ud83d\ude00""#).unwrap();
    assert_eq!(v.as_str().unwrap(), &Str::from("😀"));
}

fn units_of(s: &str) -> Vec<u16> {
    s.encode_utf16().collect()
}

#[test]
fn control_characters_are_escaped_as_json_stringify_does() {
    let s = Value::String(Str::from(
        "\u{0}\u{8}\t\n\u{b}\u{c}\r\u{1f} \u{7f}\u{2028}\u{202e}é",
    ));
    assert_eq!(
        to_compact(&s),
        "\"\\u0000\\b\\t\\n\\u000b\\f\\r\\u001f \u{7f}\u{2028}\u{202e}é\""
    );
}

#[test]
fn repeated_keys_keep_the_first_place_and_the_last_value() {
    let v = parse(br#"{"a":1,"b":2,"a":3}"#).unwrap();
    assert_eq!(to_compact(&v), r#"{"a":3,"b":2}"#);
}

#[test]
fn only_strict_json_is_accepted() {
    for bad in [
        "",
        " ",
        "{",
        "{\"a\":1,}",
        "[1,]",
        "[01]",
        "[1.]",
        "[.5]",
        "[+1]",
        "[1e]",
        "[-]",
        "[NaN]",
        "[Infinity]",
        "{'a':1}",
        "{a:1}",
        "\"\\x41\"",
        "\"\\u12\"",
        "\"\\u12g4\"",
        "\"tab\tinside\"",
        "\"line\ninside\"",
        "\u{feff}{}",
        "{} {}",
        "{}x",
        "// c\n{}",
        "[1]\u{a0}",
        "tru",
        "nul",
        "[true false]",
    ] {
        assert!(parse(bad.as_bytes()).is_err(), "accepted {bad:?}");
    }
    assert!(parse(b"\xff{}").is_err());
    assert!(
        parse(b"\"\xed\xa0\xbd\"").is_err(),
        "CESU-8 surrogates are not UTF-8"
    );
    for good in ["{}", " \t\r\n[ ]\n", "-0.0e-0", "0", "\"\\/\"", "[[],{}]"] {
        assert!(parse(good.as_bytes()).is_ok(), "refused {good:?}");
    }
}

#[test]
fn a_truncated_text_says_so() {
    let whole = br#"{"version": 1, "entries": {"s": {"a": "x\ud83d", "n": -12.5e3, "t": true}}}"#;
    for cut in 1..whole.len() {
        let err = parse(&whole[..cut]).unwrap_err();
        // A cut after a complete number ("-12") still parses as far as
        // it goes, and then misses the closing brace: also end of text.
        assert!(err.eof, "cut at {cut}: {err}");
    }
    let err = parse(b"{\"a\" 1}").unwrap_err();
    assert!(!err.eof);
    assert_eq!((err.line, err.column), (1, 6), "{err}");
}

#[test]
fn deep_nesting_is_refused_without_exhausting_the_stack() {
    let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert!(parse(ok.as_bytes()).is_ok());
    let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    assert!(parse(deep.as_bytes()).is_err());
    let hostile = "[{\"a\":".repeat(1_000_000);
    assert!(parse(hostile.as_bytes()).is_err());
}

use crate::test_rng::Rng;

fn hostile_units(rng: &mut Rng) -> Vec<u16> {
    let pool: [u16; 16] = [
        0xD83D, 0xDE00, 0xDBFF, 0xDC00, 0xD800, 0xDFFF, 0x0000, 0x001F, 0x0022, 0x005C, 0x2028,
        0x202E, 0xFEFF, 0x007F, 0x00E9, 0x0031,
    ];
    (0..rng.next() % 12)
        .map(|_| match rng.next() % 3 {
            0 => pool[(rng.next() % 16) as usize],
            1 => (rng.next() % 0x80) as u16,
            _ => rng.next() as u16,
        })
        .collect()
}

#[test]
fn any_javascript_string_round_trips() {
    let mut rng = Rng(0x5EED_1234_ABCD_0001);
    for _ in 0..5_000 {
        let key = Str::from_units(hostile_units(&mut rng));
        let val = Str::from_units(hostile_units(&mut rng));
        let mut map = Object::new();
        map.insert(key, Value::String(val));
        let v = Value::Object(map);
        for text in [to_pretty(&v), to_compact(&v)] {
            let back = parse(text.as_bytes()).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(back, v, "{text:?}");
            assert_eq!(to_pretty(&back), to_pretty(&v));
        }
    }
}

#[test]
fn format_characters_match_the_table() {
    for c in [
        '\u{202e}',
        '\u{200b}',
        '\u{2066}',
        '\u{2069}',
        '\u{feff}',
        '\u{e007f}',
    ] {
        assert!(is_format(c) && is_invisible(c), "{c:?}");
    }
    for c in ['a', 'é', '😀', '\u{2070}', '\u{fffc}'] {
        assert!(!is_format(c), "{c:?}");
    }
    assert!(is_invisible('\u{2028}') && is_invisible('\u{85}') && is_invisible('\u{7f}'));
}
