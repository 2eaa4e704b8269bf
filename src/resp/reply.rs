//! Replies corral writes itself, encoded for the client's protocol. Error texts live in
//! `error::replies`.

use bytes::{BufMut, BytesMut};

/// The protocol a client (or an upstream connection) speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Proto {
    /// RESP2, the default for every new connection.
    #[default]
    Resp2,
    /// RESP3, after `HELLO 3`.
    Resp3,
}

impl Proto {
    /// The protocol number as HELLO reports it.
    pub fn as_int(self) -> i64 {
        match self {
            Proto::Resp2 => 2,
            Proto::Resp3 => 3,
        }
    }
}

/// `+OK`
pub const OK: &[u8] = b"+OK\r\n";
/// `+PONG`
pub const PONG: &[u8] = b"+PONG\r\n";
/// Builds replies in one protocol into a buffer.
#[derive(Debug)]
pub struct Encoder<'a> {
    /// Protocol to encode for.
    pub proto: Proto,
    /// Where the bytes go.
    pub out: &'a mut BytesMut,
}

impl Encoder<'_> {
    /// Raw, already-encoded bytes.
    pub fn raw(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    /// `+text`
    pub fn simple(&mut self, text: &str) {
        self.line(b'+', text.as_bytes());
    }

    /// `-text` (the text includes the error code, e.g. `ERR ...`).
    pub fn error(&mut self, text: &str) {
        self.line(b'-', text.as_bytes());
    }

    /// `:n`
    pub fn int(&mut self, n: i64) {
        self.out.put_u8(b':');
        self.out
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        self.out.extend_from_slice(b"\r\n");
    }

    /// `$len\r\nbytes`
    pub fn bulk(&mut self, bytes: &[u8]) {
        self.header(b'$', bytes.len());
        self.out.extend_from_slice(bytes);
        self.out.extend_from_slice(b"\r\n");
    }

    /// A verbatim string in RESP3 (`=len\r\ntxt:...`), a bulk string in RESP2.
    pub fn verbatim(&mut self, text: &[u8]) {
        match self.proto {
            Proto::Resp2 => self.bulk(text),
            Proto::Resp3 => {
                self.header(b'=', text.len() + 4);
                self.out.extend_from_slice(b"txt:");
                self.out.extend_from_slice(text);
                self.out.extend_from_slice(b"\r\n");
            }
        }
    }

    /// The null bulk string: `$-1` in RESP2, `_` in RESP3.
    pub fn null(&mut self) {
        self.raw(match self.proto {
            Proto::Resp2 => b"$-1\r\n",
            Proto::Resp3 => b"_\r\n",
        });
    }

    /// Array header for `n` elements.
    pub fn array(&mut self, n: usize) {
        self.header(b'*', n);
    }

    /// Map header for `n` pairs: `%n` in RESP3, a flat `*2n` array in RESP2.
    pub fn map(&mut self, n: usize) {
        match self.proto {
            Proto::Resp2 => self.header(b'*', n * 2),
            Proto::Resp3 => self.header(b'%', n),
        }
    }

    fn header(&mut self, kind: u8, n: usize) {
        self.out.put_u8(kind);
        self.out
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        self.out.extend_from_slice(b"\r\n");
    }

    fn line(&mut self, kind: u8, text: &[u8]) {
        self.out.put_u8(kind);
        // A CR or LF inside a status line would desynchronise the client; Redis replaces them
        // with spaces too.
        self.out.extend(
            text.iter()
                .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
        );
        self.out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(proto: Proto, f: impl FnOnce(&mut Encoder<'_>)) -> Vec<u8> {
        let mut out = BytesMut::new();
        f(&mut Encoder {
            proto,
            out: &mut out,
        });
        out.to_vec()
    }

    #[test]
    fn null_and_map_depend_on_protocol() {
        assert_eq!(enc(Proto::Resp2, |e| e.null()), b"$-1\r\n");
        assert_eq!(enc(Proto::Resp3, |e| e.null()), b"_\r\n");
        assert_eq!(enc(Proto::Resp2, |e| e.map(2)), b"*4\r\n");
        assert_eq!(enc(Proto::Resp3, |e| e.map(2)), b"%2\r\n");
    }

    #[test]
    fn status_lines_cannot_break_framing() {
        assert_eq!(
            enc(Proto::Resp2, |e| e.error("ERR a\r\nb")),
            b"-ERR a  b\r\n"
        );
    }

    #[test]
    fn verbatim_is_bulk_in_resp2() {
        assert_eq!(enc(Proto::Resp2, |e| e.verbatim(b"hi")), b"$2\r\nhi\r\n");
        assert_eq!(
            enc(Proto::Resp3, |e| e.verbatim(b"hi")),
            b"=6\r\ntxt:hi\r\n"
        );
    }
}
