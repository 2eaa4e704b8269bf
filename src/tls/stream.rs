//! One connection type for plain TCP and TLS, dispatched by an enum so the plain path costs a
//! branch and nothing else.

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp;

type TlsStream = tokio_rustls::TlsStream<TcpStream>;

/// A connection to a client or to Redis: plain TCP, or TLS over TCP (either side of the
/// handshake). Reads and writes application bytes; TLS records are handled inside.
#[derive(Debug)]
pub enum Stream {
    /// Clear text.
    Plain(TcpStream),
    /// TLS, boxed because rustls's state is large and the plain variant should stay small.
    Tls(Box<TlsStream>),
}

impl From<TcpStream> for Stream {
    fn from(tcp: TcpStream) -> Stream {
        Stream::Plain(tcp)
    }
}

impl Stream {
    /// The TCP socket under any TLS layer.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref().0,
        }
    }

    /// True for a TLS connection.
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    /// As [`TcpStream::peer_addr`].
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp().peer_addr()
    }

    /// As [`TcpStream::local_addr`].
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp().local_addr()
    }

    /// As [`TcpStream::set_nodelay`].
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.tcp().set_nodelay(nodelay)
    }

    /// Borrowed read and write halves usable at once (as [`TcpStream::split`]). Plain halves are
    /// the socket's own, lock-free; TLS halves share one session through tokio's split lock,
    /// which is uncontended here because one task owns both halves.
    pub fn split(&mut self) -> (ReadHalf<'_>, WriteHalf<'_>) {
        match self {
            Stream::Plain(s) => {
                let (r, w) = s.split();
                (ReadHalf::Plain(r), WriteHalf::Plain(w))
            }
            Stream::Tls(s) => {
                let (r, w) = tokio::io::split(&mut **s);
                (ReadHalf::Tls(r), WriteHalf::Tls(w))
            }
        }
    }
}

/// The read half of [`Stream::split`].
#[derive(Debug)]
pub enum ReadHalf<'a> {
    /// Clear text.
    Plain(tcp::ReadHalf<'a>),
    /// TLS.
    Tls(tokio::io::ReadHalf<&'a mut TlsStream>),
}

/// The write half of [`Stream::split`].
#[derive(Debug)]
pub enum WriteHalf<'a> {
    /// Clear text.
    Plain(tcp::WriteHalf<'a>),
    /// TLS.
    Tls(tokio::io::WriteHalf<&'a mut TlsStream>),
}

/// Forwards the `AsyncRead` method to whichever variant is live.
macro_rules! impl_read {
    ($ty:ty) => {
        impl AsyncRead for $ty {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
                    Self::Tls(s) => Pin::new(s).poll_read(cx, buf),
                }
            }
        }
    };
}

/// Forwards the `AsyncWrite` methods to whichever variant is live, vectored writes included
/// (both TCP and rustls take them without copying).
macro_rules! impl_write {
    ($ty:ty) => {
        impl AsyncWrite for $ty {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
                    Self::Tls(s) => Pin::new(s).poll_write(cx, buf),
                }
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
                    Self::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    Self::Plain(s) => s.is_write_vectored(),
                    Self::Tls(s) => s.is_write_vectored(),
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_flush(cx),
                    Self::Tls(s) => Pin::new(s).poll_flush(cx),
                }
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
                    Self::Tls(s) => Pin::new(s).poll_shutdown(cx),
                }
            }
        }
    };
}

impl_read!(Stream);
impl_read!(ReadHalf<'_>);
impl_write!(Stream);
impl_write!(WriteHalf<'_>);
