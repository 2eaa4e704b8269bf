#![no_main]
//! The reply scanner, fed a buffer whole and in pieces, must find the same frame ends; the
//! frame helpers must take whatever frame it accepts without panicking; `frames()` must cut
//! the buffer where it does; and where redis-protocol decodes a frame, that frame must end
//! where the scanner says. The first byte of the input is the pieces' size.
use corral::resp::ReplyScanner;
use corral::resp::frames;
use libfuzzer_sys::fuzz_target;

/// The frame ends (and whether each is a push) found in `buf` given `step` more bytes each
/// time the scanner asks for more, and whether it stopped at an error.
fn scan(buf: &[u8], step: usize) -> (Vec<(usize, bool)>, bool) {
    let mut s = ReplyScanner::new();
    let mut ends = Vec::new();
    let mut avail = step.min(buf.len());
    loop {
        match s.next_frame(&buf[..avail]) {
            Ok(Some(f)) => {
                assert!(f.end <= avail);
                ends.push((f.end, f.push));
            }
            Ok(None) => {
                if avail == buf.len() {
                    return (ends, false);
                }
                avail = (avail + step).min(buf.len());
            }
            Err(_) => return (ends, true),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let step = (data[0] as usize).max(1);
    let buf = &data[1..];
    let whole = scan(buf, buf.len().max(1));
    let pieces = scan(buf, step);
    // The same frames, and the same verdict at the end, however the bytes arrive.
    assert_eq!(whole, pieces, "whole vs pieces of {step}");
    let decode = |at: usize| {
        let rest = bytes::Bytes::copy_from_slice(&buf[at..]);
        match redis_protocol::resp3::decode::complete::decode_bytes(&rest) {
            Ok(Some((_, n))) => Some(n),
            _ => None,
        }
    };
    let mut start = 0;
    for &(end, push) in &whole.0 {
        let frame = &buf[start..end];
        let _ = frames::is_null(frame);
        let _ = frames::int_value(frame);
        let _ = frames::bulk_body(frame);
        let _ = frames::array_elements(frame);
        let _ = frames::pair_elements(frame);
        let _ = frames::array_parts(frame);
        if push {
            let _ = frames::push_elements(frame);
        }
        if let Some(n) = decode(start) {
            assert_eq!(
                n,
                frame.len(),
                "redis-protocol ends the frame at {start} elsewhere"
            );
        }
        start = end;
    }
    // Where the scanner waits for more bytes, no complete frame may be there already: it
    // would wait for bytes that never come, and hold up the connection.
    if !whole.1 {
        assert_eq!(
            decode(start),
            None,
            "a frame at {start} the scanner waits on"
        );
    }
    let n = frames::frames(buf).count();
    assert_eq!(n, whole.0.len(), "frames() and the scanner disagree");
});
