//! A decoded reply reduced to what topology parsing needs, the same for RESP2 and RESP3.
//!
//! RESP3 maps become flat `[key, value, ...]` lists, which is how RESP2 sends them, so one
//! parser reads both shapes.

use redis_protocol::resp2::types::OwnedFrame as Frame2;
use redis_protocol::resp3::types::OwnedFrame as Frame3;

/// A reply value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Int(i64),
    Str(Vec<u8>),
    List(Vec<Value>),
    Error(String),
    /// Null, and RESP3 types topology replies never use (doubles, booleans...).
    Null,
}

/// Why a reply could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// Not valid RESP.
    Invalid(String),
    /// The frame is cut short.
    Incomplete,
}

/// Decodes one complete frame from the start of `bytes`.
pub(crate) fn decode(bytes: &[u8]) -> Result<Value, DecodeError> {
    // The RESP3 decoder rejects RESP2's `$-1`/`*-1`, so RESP2 is the fallback.
    match redis_protocol::resp3::decode::complete::decode(bytes) {
        Ok(Some((frame, _))) => Ok(from3(frame)),
        Ok(None) => Err(DecodeError::Incomplete),
        Err(e3) => match redis_protocol::resp2::decode::decode(bytes) {
            Ok(Some((frame, _))) => Ok(from2(frame)),
            Ok(None) => Err(DecodeError::Incomplete),
            Err(_) => Err(DecodeError::Invalid(e3.to_string())),
        },
    }
}

fn from2(f: Frame2) -> Value {
    match f {
        Frame2::SimpleString(s) | Frame2::BulkString(s) => Value::Str(s),
        Frame2::Error(e) => Value::Error(e),
        Frame2::Integer(i) => Value::Int(i),
        Frame2::Array(items) => Value::List(items.into_iter().map(from2).collect()),
        Frame2::Null => Value::Null,
    }
}

fn from3(f: Frame3) -> Value {
    match f {
        Frame3::BlobString { data, .. }
        | Frame3::SimpleString { data, .. }
        | Frame3::VerbatimString { data, .. } => Value::Str(data),
        Frame3::SimpleError { data, .. } => Value::Error(data),
        Frame3::BlobError { data, .. } => Value::Error(String::from_utf8_lossy(&data).into_owned()),
        Frame3::Number { data, .. } => Value::Int(data),
        Frame3::Array { data, .. } | Frame3::Push { data, .. } => {
            Value::List(data.into_iter().map(from3).collect())
        }
        Frame3::Set { data, .. } => Value::List(data.into_iter().map(from3).collect()),
        Frame3::Map { data, .. } => Value::List(
            data.into_iter()
                .flat_map(|(k, v)| [from3(k), from3(v)])
                .collect(),
        ),
        _ => Value::Null,
    }
}

impl Value {
    /// The elements of a list.
    pub(crate) fn as_list(&self) -> Option<&[Value]> {
        match self {
            Value::List(v) => Some(v),
            _ => None,
        }
    }

    /// A string as UTF-8 text.
    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => std::str::from_utf8(s).ok(),
            _ => None,
        }
    }

    /// An integer, also when sent as a string.
    pub(crate) fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Str(_) => self.as_str()?.parse().ok(),
            _ => None,
        }
    }

    /// The value under `key` in a flat `[key, value, ...]` map.
    pub(crate) fn field(&self, key: &str) -> Option<&Value> {
        self.as_list()?
            .chunks_exact(2)
            .find(|kv| kv[0].as_str().is_some_and(|k| k.eq_ignore_ascii_case(key)))
            .map(|kv| &kv[1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp2_and_resp3_maps_read_alike() {
        let two = decode(b"*4\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n$-1\r\n").unwrap();
        let three = decode(b"%2\r\n+a\r\n:1\r\n$1\r\nb\r\n_\r\n").unwrap();
        for v in [&two, &three] {
            assert_eq!(v.field("a").and_then(Value::as_int), Some(1));
            assert_eq!(v.field("B"), Some(&Value::Null));
            assert_eq!(v.field("c"), None);
        }
    }

    #[test]
    fn errors_and_garbage() {
        assert_eq!(
            decode(b"-ERR nope\r\n"),
            Ok(Value::Error("ERR nope".into()))
        );
        assert_eq!(decode(b"*2\r\n:1\r\n"), Err(DecodeError::Incomplete));
        assert!(matches!(decode(b"hello\r\n"), Err(DecodeError::Invalid(_))));
    }
}
