//! The host a deploy goes to, as written on the command line: `user@host[:port]`.

use std::fmt;
use std::str::FromStr;

/// `user@host[:port]`; the user and the port are optional (ssh's defaults then apply),
/// an IPv6 address with a port is written in brackets (`user@[::1]:2222`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
}

impl Target {
    /// `user@host` as ssh takes it (the port goes to `-p`).
    pub fn login(&self) -> String {
        match &self.user {
            Some(user) => format!("{user}@{}", self.host),
            None => self.host.clone(),
        }
    }

    /// `user@host` as rsync takes it before `:path` (an IPv6 address in brackets).
    pub fn rsync_login(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        match &self.user {
            Some(user) => format!("{user}@{host}"),
            None => host,
        }
    }

    /// The port, ssh's default if none was given.
    pub fn port_or_default(&self) -> u16 {
        self.port.unwrap_or(22)
    }

    /// A folder name for this host's fetched results: the host, and the port when one
    /// was given (`127.0.0.1-2222`).
    pub fn label(&self) -> String {
        let host = self.host.replace(':', "_");
        match self.port {
            Some(port) => format!("{host}-{port}"),
            None => host,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(user) = &self.user {
            write!(f, "{user}@")?;
        }
        match self.port {
            Some(port) if self.host.contains(':') => write!(f, "[{}]:{port}", self.host),
            Some(port) => write!(f, "{}:{port}", self.host),
            None => write!(f, "{}", self.host),
        }
    }
}

impl FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Target, String> {
        let expected = "expected user@host, user@host:port or user@[ipv6]:port";
        let (user, rest) = match s.split_once('@') {
            Some((user, rest)) => (Some(user.to_string()), rest),
            None => (None, s),
        };
        let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
            let (host, after) = inner
                .split_once(']')
                .ok_or_else(|| format!("{expected}, found an unclosed `[` in `{s}`"))?;
            match after {
                "" => (host, None),
                _ => match after.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    None => return Err(format!("{expected}, found `{after}` after `]` in `{s}`")),
                },
            }
        } else {
            match rest.matches(':').count() {
                0 => (rest, None),
                1 => {
                    let (host, port) = rest.split_once(':').expect("one colon");
                    (host, Some(port))
                }
                // A bare IPv6 address: no port can follow it unbracketed. Anything else with
                // two colons is a mistake (`host:2222:22`), not an address.
                _ if rest.parse::<std::net::Ipv6Addr>().is_ok() => (rest, None),
                _ => {
                    return Err(format!(
                        "{expected}, found `{rest}` in `{s}`: more than one `:`, which only an \
                         IPv6 address has (one port at most; an IPv6 address with a port goes \
                         in brackets)"
                    ));
                }
            }
        };
        let port = port
            .map(|p| {
                p.parse::<u16>()
                    .ok()
                    .filter(|&p| p != 0)
                    .ok_or_else(|| format!("{expected}, found the port `{p}` in `{s}`"))
            })
            .transpose()?;
        // A leading `-` would read as an ssh option.
        let plain =
            |w: &str| !w.is_empty() && !w.starts_with('-') && !w.contains(char::is_whitespace);
        if !plain(host) {
            return Err(format!("{expected}, found the host `{host}` in `{s}`"));
        }
        if let Some(user) = &user
            && !plain(user)
        {
            return Err(format!("{expected}, found the user `{user}` in `{s}`"));
        }
        Ok(Target {
            user,
            host: host.to_string(),
            port,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Target {
        s.parse().unwrap()
    }

    #[test]
    fn user_host_and_port_are_read() {
        let full = t("root@127.0.0.1:2222");
        assert_eq!(full.user.as_deref(), Some("root"));
        assert_eq!(full.host, "127.0.0.1");
        assert_eq!(full.port, Some(2222));
        assert_eq!(full.login(), "root@127.0.0.1");
        assert_eq!(full.label(), "127.0.0.1-2222");
        assert_eq!(full.to_string(), "root@127.0.0.1:2222");

        let bare = t("h100");
        assert_eq!((bare.user.as_deref(), bare.port), (None, None));
        assert_eq!(bare.port_or_default(), 22);
        assert_eq!(bare.to_string(), "h100");
    }

    #[test]
    fn ipv6_addresses_take_brackets_with_a_port() {
        let v6 = t("me@[::1]:2200");
        assert_eq!(v6.host, "::1");
        assert_eq!(v6.port, Some(2200));
        assert_eq!(v6.login(), "me@::1");
        assert_eq!(v6.rsync_login(), "me@[::1]");
        assert_eq!(v6.label(), "__1-2200");
        assert_eq!(v6.to_string(), "me@[::1]:2200");
        assert_eq!(t("me@::1").host, "::1");
        assert_eq!(t("fe80::1:2").host, "fe80::1:2");
        let err = "root@host:2222:22".parse::<Target>().unwrap_err();
        assert!(
            err.ends_with(
                "found `host:2222:22` in `root@host:2222:22`: more than one `:`, which \
                 only an IPv6 address has (one port at most; an IPv6 address with a port goes in \
                 brackets)"
            ),
            "{err}"
        );
    }

    #[test]
    fn malformed_targets_say_what_was_expected() {
        for bad in [
            "root@",
            "@host",
            "host:0",
            "host:ssh",
            "root@[::1",
            "-oProxyCommand=x",
            "a b",
            "host:2222:22",
            "me@gpu:22:",
        ] {
            let err = bad.parse::<Target>().unwrap_err();
            assert!(err.starts_with("expected user@host"), "{bad}: {err}");
        }
    }
}
