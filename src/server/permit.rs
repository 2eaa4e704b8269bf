//! What corral itself refuses or rewrites before routing: the command guard (`[commands]`,
//! like Redis's `rename-command`) and the permissions of corral's own users (`[[users]]`),
//! with Redis's own error texts. Inside MULTI a refusal makes EXEC fail, as in Redis.

use bytes::{Bytes, BytesMut};

use super::client::Conn;
use super::gate::unknown_command;
use crate::acl::{self, Denied, Guard, User, Verdict};
use crate::commands::Command;
use crate::resp::Args;
use crate::resp::encode::encode_request;

/// What the guard made of a request.
pub(super) enum Guarded {
    /// Routed as sent.
    Pass,
    /// Called by its new name: routed as these arguments, sent as `bytes`.
    Renamed {
        /// The arguments with the real name first.
        argv: Vec<Vec<u8>>,
        /// `argv` encoded as RESP.
        bytes: Bytes,
    },
    /// Refused (unknown to clients): this error is the reply.
    Refused(Bytes),
}

impl Guarded {
    /// The request to route: the renamed one, or the one sent (`args`, `frame`, `inline`).
    pub(super) fn request<'a>(
        &'a self,
        args: Args<'a>,
        frame: &'a [u8],
        inline: bool,
    ) -> (Command<'a>, &'a [u8], bool) {
        match self {
            Guarded::Renamed { argv, bytes } => (Command::new(Args::Owned(argv)), bytes, false),
            _ => (Command::new(args), frame, inline),
        }
    }

    /// The guard's refusal, if it refused the request.
    pub(super) fn refusal(&self) -> Option<Bytes> {
        match self {
            Guarded::Refused(reply) => Some(reply.clone()),
            _ => None,
        }
    }
}

impl Conn {
    /// What the guard makes of a request; nothing to do without `[commands]`.
    pub(super) fn guarded(&self, args: &Args<'_>) -> Guarded {
        if self.shared.guard.is_empty() {
            Guarded::Pass
        } else {
            guard(&self.shared.guard, args)
        }
    }
}

/// Applies the guard to a request.
fn guard(guard: &Guard, args: &Args<'_>) -> Guarded {
    let Some(name) = args.get(0) else {
        return Guarded::Pass;
    };
    match guard.check(name, args.get(1)) {
        Verdict::Pass => Guarded::Pass,
        Verdict::UnknownCommand => Guarded::Refused(unknown_command(args)),
        Verdict::UnknownSubcommand => Guarded::Refused(acl::unknown_subcommand(
            name,
            args.get(1).unwrap_or_default(),
        )),
        Verdict::Rename(real) => {
            let mut argv: Vec<Vec<u8>> = args.iter().map(<[u8]>::to_vec).collect();
            argv[0] = real.into_bytes();
            let refs: Vec<&[u8]> = argv.iter().map(Vec::as_slice).collect();
            let mut out = BytesMut::new();
            encode_request(&refs, &mut out);
            Guarded::Renamed {
                argv,
                bytes: out.freeze(),
            }
        }
    }
}

/// Checks a request against a corral user's permissions, as Redis does after the command's
/// existence and arity: the command, then its keys, then its channels. The error is Redis's.
/// A malformed request is let through: Redis refuses it for that first.
pub(super) fn check(user: &User, cmd: &Command<'_>) -> Result<(), Bytes> {
    let argv: Vec<&[u8]> = cmd.args.iter().collect();
    let Ok(name) = acl::resolve(&argv) else {
        return Ok(());
    };
    // A shard channel sits where a key would (it is routed by its slot), but Redis marks it
    // as no key (`NOT_KEY`): only the channel rules apply to it.
    let keys_apply = !matches!(cmd.name(), b"SPUBLISH" | b"SSUBSCRIBE" | b"SUNSUBSCRIBE");
    let denied = user
        .check_named(name)
        .and_then(|()| {
            if keys_apply {
                user.check_keys(cmd.keys().keys(&cmd.args))
            } else {
                Ok(())
            }
        })
        .and_then(|()| check_channels(user, cmd, &argv));
    match denied {
        Ok(()) if user.all_keys() => Ok(()),
        Ok(()) => match cmd.name() {
            b"SORT" | b"SORT_RO" => sort_patterns(&argv),
            _ => Ok(()),
        },
        // A command Redis 7.0 does not know (a typo): Redis reports it as unknown before it
        // checks permissions. corral cannot tell a newer command from a typo, and must not
        // let a restricted user run the former: both get the unknown-command error.
        Err(Denied::Command(name))
            if acl::arity(&name).is_none() && !name.contains('|') && name != "corral" =>
        {
            Err(unknown_command(&cmd.args))
        }
        Err(d) => Err(d.reply()),
    }
}

/// The channels of PUBLISH and the (P|S)SUBSCRIBE family (unsubscribing is never refused).
fn check_channels(user: &User, cmd: &Command<'_>, argv: &[&[u8]]) -> Result<(), Denied> {
    let rest = argv.get(1..).unwrap_or_default();
    match cmd.name() {
        b"PUBLISH" | b"SPUBLISH" => user.check_channels(rest.iter().take(1).copied(), false),
        b"SUBSCRIBE" | b"SSUBSCRIBE" => user.check_channels(rest.iter().copied(), false),
        b"PSUBSCRIBE" => user.check_channels(rest.iter().copied(), true),
        _ => Ok(()),
    }
}

/// SORT's BY and GET patterns read keys no key check sees: Redis refuses them (BY only with
/// a `*` in it, GET always) to a user without access to every key, scanning the options left
/// to right as it parses them. Anything it would reject as a syntax error is left to it.
fn sort_patterns(argv: &[&[u8]]) -> Result<(), Bytes> {
    let mut j = 2;
    while let Some(opt) = argv.get(j) {
        let left = argv.len() - j - 1;
        let is = |w: &[u8]| opt.eq_ignore_ascii_case(w);
        if is(b"ASC") || is(b"DESC") || is(b"ALPHA") {
            j += 1;
        } else if is(b"LIMIT") && left >= 2 {
            j += 3;
        } else if is(b"STORE") && left >= 1 {
            j += 2;
        } else if is(b"BY") && left >= 1 {
            if argv[j + 1].contains(&b'*') {
                return Err(crate::error::replies::SORT_BY_DENIED.to_bytes());
            }
            j += 2;
        } else if is(b"GET") && left >= 1 {
            return Err(crate::error::replies::SORT_GET_DENIED.to_bytes());
        } else {
            break;
        }
    }
    Ok(())
}
