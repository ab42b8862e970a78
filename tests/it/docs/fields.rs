//! A recording serde `Deserializer`: it walks a `#[derive(Deserialize)]`
//! type and says which fields it takes and of what type, so that the field
//! reference is made from the parsers themselves.
//!
//! Each pass descends along one path of field names, handing the type one
//! key at a time, and stops (with an error) where the path ends, noting what
//! the type asked for there: the fields of a struct, the variants of an
//! enum, a scalar, or (for a hand-written `Deserialize`) what its visitor
//! says it expects.

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::cell::RefCell;
use std::fmt;

/// What a type asked for at the end of a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    Struct(Vec<&'static str>),
    Enum(Vec<&'static str>),
    Scalar(String),
    Array(Box<Shape>),
    Map(Box<Shape>),
    Optional(Box<Shape>),
}

impl Shape {
    /// A short type name for the reference page.
    pub fn describe(&self) -> String {
        match self {
            Shape::Struct(_) => "table".into(),
            Shape::Enum(v) => format!(
                "one of {}",
                v.iter()
                    .map(|s| format!("`\"{s}\"`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Shape::Scalar(s) => s.clone(),
            Shape::Array(inner) => match **inner {
                Shape::Struct(_) => "array of tables".into(),
                ref i => format!("array of {}", i.describe()),
            },
            Shape::Map(inner) => format!("table of {}", inner.describe()),
            Shape::Optional(inner) => inner.describe(),
        }
    }

    /// The fields of the struct this is, or holds.
    pub fn fields(&self) -> Option<&[&'static str]> {
        match self {
            Shape::Struct(f) => Some(f),
            Shape::Array(i) | Shape::Map(i) | Shape::Optional(i) => i.fields(),
            _ => None,
        }
    }
}

#[derive(Debug)]
pub struct Stop;
impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("stop")
    }
}
impl std::error::Error for Stop {}
impl de::Error for Stop {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Stop
    }
}

/// The recorder at one point of a pass: what is left of the path, and
/// where the shape found at its end goes (wrappers first).
pub struct Rec<'a> {
    path: &'a [String],
    wrap: &'a RefCell<Vec<Shape>>,
}

struct Expecting<'a, V>(&'a V);
impl<'de, V: Visitor<'de>> fmt::Display for Expecting<'_, V> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.0.expecting(f)
    }
}

impl Rec<'_> {
    fn at_end(&self) -> bool {
        self.path.is_empty()
    }
    fn found(&self, s: Shape) -> Stop {
        self.wrap.borrow_mut().push(s);
        Stop
    }
}

/// A map of one key, the next name on the path, whose value is recorded.
struct OneKey<'a> {
    rec: Option<Rec<'a>>,
}

impl<'de> MapAccess<'de> for OneKey<'_> {
    type Error = Stop;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Stop> {
        match &self.rec {
            None => Ok(None),
            Some(r) => {
                let key = r.path[0].clone();
                seed.deserialize(de::value::StringDeserializer::<Stop>::new(key))
                    .map(Some)
            }
        }
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Stop> {
        let r = self.rec.take().expect("a key came first");
        seed.deserialize(Rec {
            path: &r.path[1..],
            wrap: r.wrap,
        })
    }
}

/// A sequence of one element, recorded.
struct OneElem<'a> {
    rec: Option<Rec<'a>>,
}

impl<'de> SeqAccess<'de> for OneElem<'_> {
    type Error = Stop;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Stop> {
        match self.rec.take() {
            None => Ok(None),
            Some(r) => seed.deserialize(r).map(Some),
        }
    }
}

macro_rules! scalar {
    ($($method:ident => $name:expr),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(if self.at_end() { self.found(Shape::Scalar($name.into())) } else { Stop })
        }
    )*};
}

impl<'de> Deserializer<'de> for Rec<'_> {
    type Error = Stop;

    scalar! {
        deserialize_bool => "bool",
        deserialize_i8 => "integer", deserialize_i16 => "integer", deserialize_i32 => "integer", deserialize_i64 => "integer",
        deserialize_u8 => "integer", deserialize_u16 => "integer", deserialize_u32 => "integer", deserialize_u64 => "integer",
        deserialize_f32 => "number", deserialize_f64 => "number",
        deserialize_char => "string", deserialize_str => "string", deserialize_string => "string",
        deserialize_bytes => "bytes", deserialize_byte_buf => "bytes",
        deserialize_unit => "unit", deserialize_identifier => "string",
    }

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Stop> {
        let what = Expecting(&v).to_string();
        Err(if self.at_end() {
            self.found(Shape::Scalar(what))
        } else {
            Stop
        })
    }
    fn deserialize_ignored_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Stop> {
        self.deserialize_any(v)
    }
    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Stop> {
        if self.at_end() {
            self.wrap
                .borrow_mut()
                .push(Shape::Optional(Box::new(Shape::Scalar(String::new()))));
        }
        v.visit_some(self)
    }
    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        v: V,
    ) -> Result<V::Value, Stop> {
        self.deserialize_unit(v)
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        v: V,
    ) -> Result<V::Value, Stop> {
        v.visit_newtype_struct(self)
    }
    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Stop> {
        if self.at_end() {
            self.wrap
                .borrow_mut()
                .push(Shape::Array(Box::new(Shape::Scalar(String::new()))));
        }
        v.visit_seq(OneElem { rec: Some(self) })
    }
    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, v: V) -> Result<V::Value, Stop> {
        self.deserialize_seq(v)
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        v: V,
    ) -> Result<V::Value, Stop> {
        self.deserialize_seq(v)
    }
    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Stop> {
        if self.at_end() {
            // A map's keys are free: record its value type under a key of any name.
            self.wrap
                .borrow_mut()
                .push(Shape::Map(Box::new(Shape::Scalar(String::new()))));
            let key = ["*".to_string()];
            let inner = Rec {
                path: &key,
                wrap: self.wrap,
            };
            return v.visit_map(OneKey { rec: Some(inner) });
        }
        v.visit_map(OneKey { rec: Some(self) })
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Stop> {
        if self.at_end() {
            return Err(self.found(Shape::Struct(fields.to_vec())));
        }
        v.visit_map(OneKey { rec: Some(self) })
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Stop> {
        Err(if self.at_end() {
            self.found(Shape::Enum(variants.to_vec()))
        } else {
            Stop
        })
    }
}

/// A type's `Deserialize::deserialize`, run on the recorder.
pub type Describe = dyn Fn(Rec<'_>) -> Result<(), Stop>;

/// Folds the wrappers a pass recorded (outermost first) around its shape.
fn fold(mut parts: Vec<Shape>) -> Option<Shape> {
    let mut shape = parts.pop()?;
    while let Some(w) = parts.pop() {
        shape = match w {
            Shape::Optional(_) => Shape::Optional(Box::new(shape)),
            Shape::Array(_) => Shape::Array(Box::new(shape)),
            Shape::Map(_) => Shape::Map(Box::new(shape)),
            other => other,
        };
    }
    Some(shape)
}

/// What `describe` (a type's `Deserialize::deserialize`) asks for at `path`.
pub fn shape_at(describe: &Describe, path: &[String]) -> Option<Shape> {
    let wrap = RefCell::new(Vec::new());
    let _ = describe(Rec { path, wrap: &wrap });
    // Wrappers of the fields above the end of the path are not this field's.
    fold(wrap.into_inner())
}

/// Every field of the type, depth first: `(dotted path, shape)`.
pub fn walk(describe: &Describe) -> Vec<(String, Shape)> {
    let mut out = Vec::new();
    let root = shape_at(describe, &[]).expect("the type asks for something");
    let mut todo: Vec<Vec<String>> = root
        .fields()
        .unwrap_or_default()
        .iter()
        .rev()
        .map(|f| vec![f.to_string()])
        .collect();
    while let Some(path) = todo.pop() {
        let Some(shape) = shape_at(describe, &path) else {
            continue;
        };
        if let Some(fields) = shape.fields() {
            for f in fields.iter().rev() {
                let mut p = path.clone();
                p.push(f.to_string());
                todo.push(p);
            }
        }
        out.push((path.join("."), shape));
    }
    out
}
