"""Secret files the daemon and the CLI read: API keys, certificate and key pairs, CA bundles; SecurityError.

Each reader refuses an unusable file with a SecurityError that names the flag
(or environment variable) and the file, before anything is served or dialled.
"""

from __future__ import annotations

import os
import re
import ssl
import stat
from pathlib import Path

from stagevisor.supervisor.errors import ErrorCode, StagevisorError

MIN_API_KEY_CHARS = 16
MAX_API_KEY_CHARS = 4096
GENERATE_KEY = "(umask 077; python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE)"
"""A shell recipe for a key file: the umask makes FILE readable by its owner only, as key_file_warning asks."""
GENERATE_HINT = f"generate one with: {GENERATE_KEY}"


class SecurityError(StagevisorError):
    """A TLS or API-key setting is unusable, or an endpoint would be exposed without protection.

    Not recoverable by retrying: the operator fixes the files or flags the message names.
    """


def read_secret(path: Path, what: str, flag: str) -> bytes:
    """The bytes of the secret file `path` (the `what` given by `flag`); SecurityError naming both when unreadable."""
    try:
        return path.read_bytes()
    except OSError as error:
        raise SecurityError(
            ErrorCode.INVALID_CONFIG, f"cannot read the {what} {path} ({flag}): {error.strerror or error}"
        ) from None


def load_api_key(path: str | os.PathLike[str] | None, flag: str = "--api-key-file") -> str | None:
    """The token in `path` (surrounding whitespace and a leading byte-order mark stripped), or None when no file
    is given.

    Refuses an empty, short or non-printable token (`parse_api_key`); see
    `key_file_warning` for a file other users may read.
    """
    if path is None:
        return None
    raw = read_secret(Path(path), "API key file", flag)
    # utf-8-sig: a byte-order mark at the start (as some editors save text) is not part of the key.
    return parse_api_key(raw.decode("utf-8-sig", "replace"), f"{flag} {path}")


def parse_api_key(text: str, source: str) -> str:
    """Validate a token from `source` (a file or an environment variable) and return it stripped."""
    token = text.strip()
    if not token:
        raise SecurityError(ErrorCode.INVALID_CONFIG, f"{source} holds no API key; {GENERATE_HINT}")
    if len(token) > MAX_API_KEY_CHARS or any(not 0x21 <= ord(c) <= 0x7E for c in token):
        raise SecurityError(
            ErrorCode.INVALID_CONFIG,
            f"{source}: the API key must be one line of printable ASCII without spaces "
            f"(at most {MAX_API_KEY_CHARS} characters); {GENERATE_HINT}",
        )
    if len(token) < MIN_API_KEY_CHARS:
        raise SecurityError(
            ErrorCode.INVALID_CONFIG,
            f"{source}: the API key has {len(token)} characters; use at least {MIN_API_KEY_CHARS}; {GENERATE_HINT}",
        )
    return token


def key_file_warning(path: str | os.PathLike[str] | None, flag: str) -> str | None:
    """A warning when a secret file is readable by group or others, else None."""
    if path is None:
        return None
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        return f"{flag} {path} is readable by other users (mode {stat.S_IMODE(mode):04o}); chmod 600 it"
    return None


def check_key_pair(cert: Path, key: Path, named: str) -> None:
    """Refuse a certificate and key that are not a PEM chain and its matching unencrypted private key, before
    either is used: gRPC takes any bytes and then fails every handshake, and OpenSSL would ask for an encrypted
    key's passphrase on the terminal (a daemon's or a script's) instead of failing."""

    def encrypted() -> str:
        raise SecurityError(
            ErrorCode.INVALID_CONFIG,
            f"{named}: the private key is encrypted, and gRPC takes only an unencrypted PEM key: give it "
            "decrypted (for example `openssl pkey -in KEY -out KEY.plain`, kept readable by this user only)",
        )

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key, password=encrypted)
    except ssl.SSLError as error:
        raise SecurityError(
            ErrorCode.INVALID_CONFIG,
            f"{named} are not a PEM certificate chain and its matching unencrypted private key "
            f"({error.reason or error})",
        ) from None


def refuse_unless_ca(pem: bytes, named: str, advice: str = "") -> None:
    """SecurityError naming the file unless `pem` holds a PEM certificate, checked on the bytes already read.

    Text around the certificates is skipped, as OpenSSL and gRPC skip it (bundles carry comments, some in
    UTF-8); a binary file is named as one, since a DER certificate is the likely mistake.
    """
    blocks = _PEM_CERTIFICATE.findall(pem)
    if blocks:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=b"\n".join(blocks).decode("ascii"))
            return
        except ssl.SSLError as error:  # a damaged certificate: OpenSSL's reason, where it gives one
            reason = error.reason or "a certificate that does not parse"
    elif pem.strip() and not pem.isascii():
        reason = "a binary file; a DER certificate converts with `openssl x509 -inform DER -in FILE -out FILE.pem`"
    else:
        reason = "no certificate in it"
    raise SecurityError(ErrorCode.INVALID_CONFIG, f"{named} is not a PEM CA bundle ({reason}){advice}")


_PEM_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]*-----END CERTIFICATE-----")
"""One PEM certificate block (base64 between its markers), as OpenSSL's PEM reader finds them in a bundle."""
