//! Every error reply corral makes itself, in one place: fixed ones as [`Canned`] constants,
//! those that name an argument as functions returning the text. Texts carry no leading `-` and
//! no CRLF: what `resp::reply::Encoder::error` takes; [`Canned::wire`] and [`line()`] give the
//! whole reply. Where corral answers in Redis's place, the text is Redis's, byte for byte.

use bytes::Bytes;

/// A fixed error reply: its text, and the same as a whole RESP line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Canned {
    text: &'static str,
    wire: &'static [u8],
}

impl Canned {
    /// The text, without the leading `-` and the CRLF.
    pub const fn text(self) -> &'static str {
        self.text
    }

    /// The whole reply: `-text\r\n`.
    pub const fn wire(self) -> &'static [u8] {
        self.wire
    }

    /// The whole reply, without copying.
    pub fn to_bytes(self) -> Bytes {
        Bytes::from_static(self.wire)
    }
}

/// Defines [`Canned`] constants from their text; the wire form is built at compile time.
macro_rules! canned {
    ($($(#[$doc:meta])* $name:ident = $text:literal;)*) => {$(
        $(#[$doc])*
        pub const $name: Canned = Canned {
            text: $text,
            wire: concat!("-", $text, "\r\n").as_bytes(),
        };
    )*};
}

// Redis's own wording, for what corral answers in Redis's place.
canned! {
    /// Any command before AUTH when a password is required.
    NOAUTH = "NOAUTH Authentication required.";
    /// A wrong password.
    WRONGPASS = "WRONGPASS invalid username-password pair or user is disabled.";
    /// AUTH when no password is configured.
    AUTH_NOT_CONFIGURED = "ERR AUTH <password> called without any password configured for \
        the default user. Are you sure your configuration is correct?";
    /// A client connecting past `max_clients`.
    MAX_CLIENTS = "ERR max number of clients reached";
    /// EXEC after a command was refused inside the transaction.
    EXECABORT = "EXECABORT Transaction discarded because of previous errors.";
    /// SORT ... BY for a user without access to every key.
    SORT_BY_DENIED = "ERR BY option of SORT denied due to insufficient ACL permissions.";
    /// SORT ... GET for a user without access to every key.
    SORT_GET_DENIED = "ERR GET option of SORT denied due to insufficient ACL permissions.";
    /// A syntax error.
    SYNTAX = "ERR syntax error";
    /// An out-of-range integer argument.
    NOT_INTEGER = "ERR value is not an integer or out of range";
    /// HELLO with a protocol version that is not a number.
    PROTO_NOT_INTEGER = "ERR Protocol version is not an integer or out of range";
    /// HELLO with a protocol version other than 2 or 3.
    NOPROTO = "NOPROTO unsupported protocol version";
    /// HELLO without AUTH from a client that has not authenticated.
    HELLO_NOAUTH = "NOAUTH HELLO must be called with the client already authenticated, \
        otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client \
        and select the RESP protocol version at the same time";
    /// CLIENT SETNAME with a name Redis does not allow.
    BAD_CLIENT_NAME = "ERR Client names cannot contain spaces, newlines or special characters.";
    /// CLIENT KILL or UNBLOCK of an unknown client.
    NO_SUCH_CLIENT = "ERR No such client";
    /// CLIENT LIST ID with an id that is not a positive integer.
    INVALID_CLIENT_ID = "ERR Invalid client ID";
    /// CLIENT KILL ID with an id that is not a positive integer.
    CLIENT_ID_NOT_POSITIVE = "ERR client-id should be greater than 0";
    /// CLIENT TRACKING REDIRECT to a client that does not exist.
    REDIRECT_TARGET_MISSING = "ERR The client ID you want redirect to does not exist";
    /// MULTI inside MULTI.
    NESTED_MULTI = "ERR MULTI calls can not be nested";
    /// WATCH inside MULTI (the transaction goes on).
    WATCH_INSIDE_MULTI = "ERR WATCH inside MULTI is not allowed";
    /// EXEC outside a transaction.
    EXEC_WITHOUT_MULTI = "ERR EXEC without MULTI";
    /// DISCARD outside a transaction.
    DISCARD_WITHOUT_MULTI = "ERR DISCARD without MULTI";
    /// A SCAN cursor corral did not hand out.
    INVALID_CURSOR = "ERR invalid cursor";
    /// CLUSTER KEYSLOT/COUNTKEYSINSLOT with a slot out of range.
    INVALID_SLOT = "ERR Invalid slot";
    /// Keys of one request in different slots (Redis Cluster's wording).
    CROSSSLOT = "CROSSSLOT Keys in request don't hash to the same slot";
    /// A slot no node serves (Redis Cluster's wording).
    SLOT_NOT_SERVED = "CLUSTERDOWN Hash slot not served";
    /// A key outside a Redis ACL user's key patterns (Redis 7.0's wording).
    NOPERM_KEY = "NOPERM this user has no permissions to access one of the keys used as arguments";
    /// A channel outside a Redis ACL user's channel patterns (Redis 7.0's wording).
    NOPERM_CHANNEL =
        "NOPERM this user has no permissions to access one of the channels used as arguments";
}

// corral's own refusals and failures.
canned! {
    /// `upstream.max_dedicated` connections are in use.
    TOO_MANY_DEDICATED =
        "ERR too many dedicated upstream connections in use (upstream.max_dedicated)";
    /// AUTH as a Redis ACL user needing a new pool while `auth.max_user_pools` are open.
    TOO_MANY_USER_POOLS = "ERR too many Redis ACL user pools in use (auth.max_user_pools)";
    /// AUTH as a Redis ACL user whose name or password is not UTF-8 (corral's handshake
    /// cannot send it).
    USER_NOT_UTF8 = "ERR corral cannot pass through an ACL user name or password that is not \
        valid UTF-8";
    /// `upstream.max_tracking_clients` clients have CLIENT TRACKING on.
    TOO_MANY_TRACKING = "ERR too many clients with CLIENT TRACKING on through corral \
        (upstream.max_tracking_clients)";
    /// CORRAL HOTKEYS or CACHE with `--no-cache`.
    CACHE_DISABLED = "ERR the cache is disabled (--no-cache)";
    /// CORRAL HOTKEYS with a count that is not a positive integer.
    COUNT_NOT_POSITIVE = "ERR count must be a positive integer";
    /// SELECT of a database other than 0 in cluster mode.
    SELECT_IN_CLUSTER = "ERR SELECT is not allowed in cluster mode";
    /// CLIENT TRACKING in cluster mode.
    TRACKING_IN_CLUSTER = "ERR CLIENT TRACKING is not supported by corral in cluster mode";
    /// CLIENT TRACKING ... REDIRECT queued inside MULTI.
    TRACKING_REDIRECT_IN_MULTI =
        "ERR CLIENT TRACKING with REDIRECT inside MULTI is not supported by corral";
    /// AUTH as a Redis ACL user in cluster mode.
    ACL_USER_IN_CLUSTER = "ERR AUTH as a Redis ACL user other than 'default' is not supported \
        by corral in cluster mode";
    /// CONFIG SET requirepass in cluster mode: each node would have to accept it for corral
    /// to follow it.
    REQUIREPASS_IN_CLUSTER = "ERR CONFIG SET 'requirepass' is not supported by corral in \
        cluster mode: set it on each node and in cluster.seeds, then reload corral";
    /// CONFIG SET requirepass with a password corral could not authenticate upstream with.
    REQUIREPASS_NOT_UTF8 = "ERR CONFIG SET 'requirepass' through corral takes a UTF-8 password";
    /// A Redis user's (un)subscribe that corral could not have Redis check (the user may not
    /// run MULTI).
    USER_PUBSUB_UNCHECKED = "ERR corral has Redis check a Redis ACL user's (un)subscribe \
        inside MULTI/DISCARD, which this user may not run";
    /// A subscription as one user from a client still subscribed as another (RESP3: it
    /// subscribed, then authenticated as someone else).
    SUBSCRIBED_AS_OTHER_USER = "ERR this client has subscriptions made as another user: \
        unsubscribe from them first (corral keeps each user's subscriptions apart)";
    /// A redirection reply outside cluster mode.
    REDIRECT_OUTSIDE_CLUSTER = "ERR redirection outside cluster mode";
    /// A cluster-only path taken outside cluster mode.
    NOT_CLUSTER_MODE = "ERR not in cluster mode";
    /// A read corral meant to send did not go out.
    READ_NOT_SENT = "ERR internal: read not sent";
}

/// `-text\r\n`, for a text built at run time (as is: the caller keeps it to one line).
pub fn line(text: &str) -> Bytes {
    let mut out = Vec::with_capacity(text.len() + 3);
    out.push(b'-');
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(b"\r\n");
    Bytes::from(out)
}

fn lossy(b: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(b)
}

/// Redis's arity error for `cmd` (lower-case name, as Redis prints it: `client|id`).
pub fn wrong_arity(cmd: &str) -> String {
    format!("ERR wrong number of arguments for '{cmd}' command")
}

/// Redis's reply to an EXEC it refused (`refusal`, an error line): the transaction is
/// discarded, and the error says why, with its code unless that is the generic `ERR`.
pub fn exec_abort_because(refusal: &[u8]) -> String {
    let why = refusal.strip_prefix(b"-").unwrap_or(refusal);
    let why = why.strip_suffix(b"\r\n").unwrap_or(why);
    let why = why.strip_prefix(b"ERR ").unwrap_or(why);
    format!("EXECABORT Transaction discarded because of: {}", lossy(why))
}

/// Redis's error for an unknown subcommand `sub` of `cmd`.
pub fn unknown_subcommand(sub: &[u8], cmd: &str) -> String {
    format!(
        "ERR unknown subcommand '{}'. Try {} HELP.",
        lossy(sub),
        cmd.to_ascii_uppercase()
    )
}

/// Redis's error for an unknown command: its name and first arguments, each clipped to 128
/// bytes.
pub fn unknown_command<'a>(name: &[u8], args: impl Iterator<Item = &'a [u8]>) -> String {
    let clip = |a: &[u8]| lossy(&a[..a.len().min(128)]).into_owned();
    let mut text = format!(
        "ERR unknown command '{}', with args beginning with: ",
        clip(name)
    );
    for a in args {
        text.push_str(&format!("'{}' ", clip(a)));
    }
    text
}

/// Redis's error for a command a subscribed RESP2 client may not send.
pub fn not_in_subscribed_context(name: &str) -> String {
    format!(
        "ERR Can't execute '{name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / \
         RESET are allowed in this context"
    )
}

/// Redis's error for a command a user may not run (`cmd` as Redis prints it: `config|get`).
pub fn no_permission(cmd: &str) -> String {
    format!("NOPERM this user has no permissions to run the '{cmd}' command")
}

/// Redis's error for a CLIENT filter of an unknown client type.
pub fn unknown_client_type(t: &[u8]) -> String {
    format!("ERR Unknown client type '{}'", lossy(t))
}

/// Redis's error for a CLIENT KILL USER filter naming another user.
pub fn no_such_user(user: &[u8]) -> String {
    format!("ERR No such user '{}'", lossy(user))
}

/// Redis's error for a HELLO option it does not know.
pub fn hello_bad_option(opt: &[u8]) -> String {
    format!("ERR Syntax error in HELLO option '{}'", lossy(opt))
}

/// Redis's error for a CLIENT SETINFO attribute it does not know.
pub fn unrecognized_option(attr: &[u8]) -> String {
    format!("ERR Unrecognized option '{}'", lossy(attr))
}

/// Redis's error for a CLIENT SETINFO value it does not allow (`attr` as given).
pub fn bad_client_info(attr: &[u8]) -> String {
    format!(
        "ERR {} cannot contain spaces, newlines or special characters.",
        lossy(&attr.to_ascii_lowercase())
    )
}

/// Redis's error for a malformed request, sent before closing the connection; like Redis, CR
/// and LF in the message become spaces so the reply stays one line.
pub fn protocol_error(msg: &[u8]) -> Vec<u8> {
    let mut out = b"-ERR Protocol error: ".to_vec();
    out.extend(
        msg.iter()
            .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
    );
    out.extend_from_slice(b"\r\n");
    out
}

/// The error for a command corral does not support (yet); names the command.
pub fn unsupported(cmd: &str, why: &str) -> String {
    format!("ERR '{cmd}' is not supported by corral: {why}")
}

/// The error for a CONFIG SET, in cluster mode, of a setting each node keeps its own value of.
pub fn per_node_setting(param: &[u8]) -> String {
    format!(
        "ERR CONFIG SET '{}' is not supported by corral in cluster mode: each node keeps its own value",
        lossy(param).to_ascii_lowercase()
    )
}

/// The error for a command corral does not support in cluster mode yet (`name` as sent).
pub fn unsupported_in_cluster(name: &[u8]) -> String {
    format!(
        "ERR '{}' is not yet supported by corral in cluster mode",
        lossy(name).to_ascii_lowercase()
    )
}

/// The error for a CLUSTER subcommand corral does not present.
pub fn cluster_subcommand_unsupported(sub: &[u8]) -> String {
    format!(
        "ERR CLUSTER {} is not supported: corral presents the cluster as a single node",
        lossy(sub)
    )
}

/// Why a Redis ACL user's connection is not made or used any more (the cause in an upstream
/// error: `-ERR upstream <addr> unavailable: <this>`).
pub const USER_REVOKED: &str = "Redis dropped or refused this ACL user's connections (user \
    deleted, password changed, client killed): AUTH again";

/// A connection made for one purpose (`MONITOR`, `CLIENT TRACKING REDIRECT`) could not be
/// made.
pub fn upstream_unavailable_for(what: &str, cause: &str) -> String {
    format!("ERR upstream unavailable for {what}: {cause}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_is_the_text_as_one_resp_line() {
        assert_eq!(EXEC_WITHOUT_MULTI.wire(), b"-ERR EXEC without MULTI\r\n");
        assert_eq!(&line(SYNTAX.text())[..], SYNTAX.wire());
        // Continued literals keep one space at each break.
        assert_eq!(
            TOO_MANY_TRACKING.text(),
            "ERR too many clients with CLIENT TRACKING on through corral \
             (upstream.max_tracking_clients)"
        );
        assert!(!HELLO_NOAUTH.text().contains("  "));
    }

    #[test]
    fn wrapped_texts_are_the_bytes_clients_got_before() {
        // As the literals read where these replies were built by hand.
        assert_eq!(
            ACL_USER_IN_CLUSTER.text(),
            "ERR AUTH as a Redis ACL user other than 'default' is not supported by corral \
                 in cluster mode"
        );
        assert_eq!(
            HELLO_NOAUTH.text(),
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the \
             HELLO AUTH <user> <pass> option can be used to authenticate the client and select \
             the RESP protocol version at the same time"
        );
        assert_eq!(
            AUTH_NOT_CONFIGURED.wire(),
            b"-ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?\r\n"
        );
        assert_eq!(
            NOPERM_KEY.wire(),
            b"-NOPERM this user has no permissions to access one of the keys used as arguments\r\n"
        );
        assert_eq!(
            no_permission("client|list"),
            "NOPERM this user has no permissions to run the 'client|list' command"
        );
        assert_eq!(
            CROSSSLOT.wire(),
            b"-CROSSSLOT Keys in request don't hash to the same slot\r\n"
        );
    }

    #[test]
    fn argument_errors_match_redis() {
        assert_eq!(
            unknown_command(b"FOO", [&b"a"[..], b"b"].into_iter()),
            "ERR unknown command 'FOO', with args beginning with: 'a' 'b' "
        );
        assert_eq!(
            protocol_error(b"bad\r\nthing"),
            b"-ERR Protocol error: bad  thing\r\n"
        );
        assert_eq!(
            unsupported_in_cluster(b"MONITOR"),
            "ERR 'monitor' is not yet supported by corral in cluster mode"
        );
    }
}
