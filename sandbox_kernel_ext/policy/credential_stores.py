"""What no sandbox ever reads: the credential stores of every home folder and of the system,
and the secrets of /etc.

One list for every way a sandbox reaches the host: the runner hides these from confined
children (`runner/trusted/plan.py`), and the file toolset refuses them inside its roots
(`files/host_backend.py`), so one policy gives one answer whichever way it is used.

A site adds its own stores to the list with `SANDBOX_KERNEL_EXT_NEVER_READ_PATHS` (read here,
so it reaches every consumer of `never_read`), and a policy its own with
`filesystem_config.never_read_paths` (`policy_stores`, which the runner's plan and the
toolset add to what they hide for that policy). Both take the same entries: an absolute path,
or `~/` and a path for that path beneath every home folder.
"""

from __future__ import annotations

import functools
import os
import stat
import tempfile
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .errors import ConfigurationError
from .paths import is_within

if TYPE_CHECKING:
    from .models import CapabilityDeclaration

__all__ = [
    "HOME_CREDENTIAL_PATHS", "SYSTEM_CREDENTIAL_PATHS", "ETC_SECRET_PATHS", "credential_paths",
    "home_folders", "etc_entry_is_secret", "etc_secret_paths", "sandbox_homes_folder",
    "never_read", "never_read_inside", "store_link_refusal", "NEVER_READ_ENV",
    "check_store_entry", "store_paths", "site_stores", "policy_stores", "outside_stores",
    "unhideable_store",
]

# The site's own stores, added to the built-in list for every sandbox and toolset: entries
# separated by os.pathsep (":"), each as `filesystem_config.never_read_paths` takes them.
NEVER_READ_ENV = "SANDBOX_KERNEL_EXT_NEVER_READ_PATHS"

# Entries of /etc never granted, by path relative to /etc: credential stores and privilege config.
ETC_SECRET_PATHS = frozenset(
    {
        "shadow", "shadow-", "gshadow", "gshadow-", ".pwd.lock",
        "sudoers", "sudoers.d", "doas.conf",
        "ssh",  # host private keys
        "ssl/private", "pki/tls/private", "letsencrypt",
        "security/opasswd", "krb5.keytab", "credstore", "credstore.encrypted",
        "ipsec.secrets", "ipsec.d", "wireguard", "openvpn",
        "NetworkManager/system-connections", "ppp/chap-secrets", "ppp/pap-secrets",
        "libvirt/secrets", "docker", "kubernetes", "rancher", "ceph",
        "postfix/sasl_passwd", "cups/ssl", "polkit-1/rules.d",
    }
)
# Name fragments that mark a secret wherever it sits below /etc.
ETC_SECRET_MARKERS = ("shadow", "secret", "private", "keytab", "keyring", "password", ".key")


def etc_entry_is_secret(relpath: str, name: str, path: str) -> bool:
    """A listed secret, a secret-looking name, a store the site lists (`NEVER_READ_ENV`), or
    something a stranger may not read anyway."""
    if relpath in ETC_SECRET_PATHS or any(marker in name.lower() for marker in ETC_SECRET_MARKERS):
        return True
    if path in _site_absolute(os.environ.get(NEVER_READ_ENV, "")):
        return True
    if name.endswith("_key"):  # ssh_host_ed25519_key and friends, wherever they are
        return True
    try:
        mode = os.stat(path).st_mode  # follows symlinks: judge what a rule would grant
    except OSError:
        return True
    # Files others cannot read, or directories others cannot list and enter, hold something the
    # owner meant to keep private; the sandbox would otherwise read them whenever it runs as root.
    needed = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
    return (mode & needed) != needed


def etc_secret_paths(etc: str = "/etc") -> list[str]:
    """The secrets ``etc_read_set`` leaves out, for a child that hides them under mounts
    instead (a secret folder is one entry: nothing below it is listed)."""
    secrets: list[str] = []

    def walk(folder: str, relroot: str) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError:
            return
        for entry in entries:
            relpath = f"{relroot}{entry.name}"
            if etc_entry_is_secret(relpath, entry.name, entry.path):
                secrets.append(entry.path)
            elif entry.is_dir(follow_symlinks=False):
                walk(entry.path, relpath + "/")

    walk(etc, "")
    return secrets


# Beneath every home folder: where tools keep keys, tokens and passwords, by kind, from where
# each tool documents that it stores them. A policy that reads "everywhere" (`readable_paths:
# null`) still never reads these. A folder is denied whole when a tool keeps its secret in a
# file whose name varies (profiles, per-host tokens) or keeps little else there.
HOME_CREDENTIAL_PATHS = (
    # keys and agents
    ".ssh", ".gnupg", ".password-store", ".local/share/keyrings", ".local/share/kwalletd",
    ".local/share/python_keyring", ".pki", ".globus", ".config/op", ".config/Bitwarden CLI",
    ".config/age", ".config/sops",
    # the X session's and the desktop session's cookies
    ".Xauthority", ".ICEauthority",
    # Jupyter and IPython: the history of every cell a kernel ran (keys typed into it
    # included), kernels' connection keys, the secret that signs trusted notebooks
    ".ipython", ".jupyter", ".local/share/jupyter",
    # cloud and cluster tools
    ".aws", ".azure", ".config/gcloud", ".oci", ".config/doctl", ".config/hcloud",
    ".config/scw", ".config/openstack", ".config/linode-cli", ".ibmcloud", ".aliyun",
    ".databrickscfg", ".snowflake", ".kube", ".minikube", ".docker", ".config/containers",
    ".config/helm", ".terraform.d", ".terraformrc", ".pulumi", ".fly", ".config/netlify",
    ".vault-token", ".config/rclone", ".s3cfg", ".boto", ".config/ngrok", ".ngrok2",
    ".config/tailscale", ".kaggle", ".config/kaggle", ".mc", ".cloudflared",
    ".config/configstore", ".config/stripe", ".sentryclirc", ".config/dvc", ".continuum",
    ".dbt",  # dbt's profiles.yml: each warehouse's user and password
    ".wrangler", ".config/.wrangler",  # Cloudflare wrangler's OAuth tokens (older, XDG place)
    ".supabase",  # the Supabase CLI's access-token, when no keyring takes it
    # code hosts and version control
    ".netrc", ".authinfo", ".authinfo.gpg", ".git-credentials", ".config/git/credentials",
    ".config/gh", ".config/hub", ".config/glab-cli",
    ".subversion",  # auth/: saved passwords (plain text on Linux); servers: proxy passwords
    ".hgrc", ".config/hg/hgrc",  # Mercurial's [auth] section holds passwords
    # editors and dev servers
    ".config/code-server",  # config.yaml holds the password of the web IDE
    # package indexes
    ".pypirc", ".config/pip", ".pip", ".npmrc", ".yarnrc", ".yarnrc.yml", ".cargo/credentials",
    ".cargo/credentials.toml", ".gem/credentials", ".m2/settings.xml",
    ".m2/settings-security.xml", ".gradle/gradle.properties", ".nuget/NuGet/NuGet.Config",
    ".config/composer/auth.json", ".composer/auth.json", ".condarc", ".config/pypoetry/auth.toml",
    # model hubs and AI assistants' logins
    ".cache/huggingface/token", ".cache/huggingface/stored_tokens", ".huggingface",
    ".codex", ".claude", ".claude.json", ".gemini", ".config/github-copilot",
    ".config/wandb", ".config/openai", ".config/io.datasette.llm", ".local/share/opencode",
    ".continue", ".comet.config", "clearml.conf", ".config/gspread", ".streamlit/secrets.toml",
    ".aider.conf.yml", ".aider/oauth-keys.env",  # aider's API keys, and OpenRouter's login
    ".env",  # the dotenv file of the home folder, where aider and others look for API keys
    # Ollama's signing key (ollama.com accounts and model pushes). Not the folder: its models
    # (gigabytes a cell may well read) live beside it.
    ".ollama/id_ed25519",
    # databases
    ".pgpass", ".my.cnf", ".mylogin.cnf",
    # browsers and mail (cookies, saved passwords)
    ".mozilla", ".librewolf", ".thunderbird", ".config/google-chrome", ".config/chromium",
    ".config/BraveSoftware", ".config/microsoft-edge", ".config/vivaldi", ".config/opera",
    "snap/firefox", "snap/chromium", ".var/app", ".msmtprc", ".fetchmailrc", ".mbsyncrc",
    # what was typed at prompts (passwords and tokens pasted included)
    ".bash_history", ".zsh_history", ".zhistory", ".histfile", ".sh_history",
    ".local/share/fish/fish_history", ".python_history", ".node_repl_history",
    ".psql_history", ".mysql_history", ".sqlite_history", ".rediscli_history",
    ".irb_history", ".Rhistory", ".julia/logs", ".duckdb_history", ".local/share/atuin",
    ".viminfo", ".ollama/history",
    # Neovim's shada (command lines, searches, registers), since 0.8 and before
    ".local/state/nvim/shada", ".local/share/nvim/shada",
    ".config/fish/fish_variables",  # fish's universal variables (`set -U TOKEN ...`)
)
# Outside the homes: orchestrators' mounted secrets and sockets, and the Jupyter kernel's own keys.
SYSTEM_CREDENTIAL_PATHS = (
    "/run/secrets", "/var/run/secrets", "/run/docker.sock", "/var/run/docker.sock",
    "/var/lib/docker", "/var/lib/kubelet", "/run/user", "/var/lib/sss", "/var/lib/jupyter",
    "/boot", "/lost+found",
)


def home_folders() -> list[str]:
    """Every home folder this host knows: the passwd database, ``/home/*``, ``/root``, $HOME."""
    homes = {"/root", os.path.expanduser("~")}
    try:
        import pwd

        homes.update(entry.pw_dir for entry in pwd.getpwall() if entry.pw_dir not in ("", "/"))
    except (ImportError, KeyError):
        pass
    try:
        homes.update(entry.path for entry in os.scandir("/home") if entry.is_dir())
    except OSError:
        pass
    # System accounts "live" in /bin, /usr/sbin, /nonexistent...: those are no homes to guard,
    # and splitting /usr/bin around a fictitious .ssh would cost a rule per program.
    return sorted(
        home for home in homes
        if os.path.isabs(home) and os.path.isdir(home)
        and not any(is_within(os.path.realpath(home), system) for system in _SYSTEM_TREES)
    )


_SYSTEM_TREES = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/dev", "/proc", "/sys", "/etc",
                 "/run/systemd", "/var/spool", "/var/cache", "/var/mail", "/var/backups")


def credential_paths() -> list[str]:
    """The built-in deny list and the site's (`NEVER_READ_ENV`), as absolute paths whether or
    not they exist now: the folders above each store resolved, the store's own name not (a
    link planted at a store's name, `~/.aws -> /usr`, must not make its target denied; a
    store it points at is on the list under its own name)."""
    paths = [os.path.join(home, name) for home in home_folders() for name in HOME_CREDENTIAL_PATHS]
    paths += SYSTEM_CREDENTIAL_PATHS
    return sorted({*map(_folder_resolved, paths), *site_stores()})


def _folder_resolved(path: str) -> str:
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


# -- stores a site or a policy adds ---------------------------------------------------------------

def check_store_entry(entry: object, what: str = "never_read_paths entry") -> str:
    """`entry` normalised (`..`-free, no trailing slash), or ValueError saying what is wrong
    with it and how to write it: an absolute path, or `~/` and a path for that path beneath
    every home folder. `what` names the entry in the message."""
    if not isinstance(entry, str):
        kind = {bool: "true or false", int: "a number", float: "a number", list: "a list",
                dict: "a mapping", type(None): "empty"}.get(type(entry), type(entry).__name__)
        raise ValueError(f"{what} must be a path written as text, not {kind} ({entry!r}); "
                         "quote it if YAML reads it as something else")
    if not entry.strip() or "\0" in entry:
        raise ValueError(f"{what} {entry!r} is blank or holds a NUL byte; write a path")
    if entry.startswith("~") and entry != "~" and not entry.startswith("~/"):
        raise ValueError(f"{what} {entry!r} names one user's home; write ~/... for the path "
                         "beneath every home folder, or the absolute path")
    home_relative = entry == "~" or entry.startswith("~/")
    rest = entry[1:] if home_relative else entry
    if not home_relative and not os.path.isabs(entry):
        raise ValueError(f"{what} {entry!r} is relative; write an absolute path "
                         "(/srv/keys/token) or ~/ and a path (~/.config/acme/token) for that "
                         "path beneath every home folder")
    if ".." in rest.split("/"):
        raise ValueError(f"{what} {entry!r} has a '..' part; write the path it means without it")
    rest = os.path.normpath(rest) if rest.strip("/") else "/"
    if not home_relative and rest == "/":
        raise ValueError(f"{what} '/' would hide everything; list the stores themselves")
    return "~" + rest.rstrip("/") if home_relative else rest


def store_paths(entries: Iterable[str]) -> list[str]:
    """Checked entries as absolute paths, in the form `credential_paths` gives (the folders
    above each resolved): `~/x` is `x` beneath every home folder (`home_folders`), as the
    built-in list is."""
    entries = list(entries)
    homes = home_folders() if any(entry.startswith("~") for entry in entries) else []
    paths: list[str] = []
    for entry in entries:
        if entry.startswith("~"):
            paths += [os.path.join(home, entry[2:]) if entry != "~" else home for home in homes]
        else:
            paths.append(entry)
    return list(dict.fromkeys(_folder_resolved(os.path.normpath(path)) for path in paths))


def site_stores() -> list[str]:
    """The stores this site adds for every sandbox (`NEVER_READ_ENV`), as absolute paths.
    A bad entry raises ConfigurationError naming the variable: a store the site meant to
    hide is never silently read."""
    return store_paths(_site_entries(os.environ.get(NEVER_READ_ENV, "")))


@functools.lru_cache(maxsize=8)
def _site_entries(raw: str) -> tuple[str, ...]:
    entries = []
    for entry in (part for part in raw.split(os.pathsep) if part.strip()):
        try:
            entries.append(check_store_entry(entry, f"{NEVER_READ_ENV} entry"))
        except ValueError as exc:
            raise ConfigurationError(f"environment variable {exc}") from None
    return tuple(entries)


@functools.lru_cache(maxsize=8)
def _site_absolute(raw: str) -> frozenset[str]:
    """The site's entries written as absolute paths (those that can lie in /etc)."""
    return frozenset(store_paths(e for e in _site_entries(raw) if not e.startswith("~")))


def policy_stores(capability: CapabilityDeclaration) -> list[str]:
    """The stores a policy adds for itself (`filesystem_config.never_read_paths`), as
    absolute paths. Unlike the built-in list, a grant of the policy's own never reaches
    them: the store wins over a readable or writable path that is it or lies in it."""
    return store_paths(capability.filesystem_config.never_read_paths)


def outside_stores(paths: Iterable[str], stores: Iterable[str]) -> list[str]:
    """`paths` but those that are or lie in one of `stores`."""
    stores = list(stores)
    return [path for path in paths if not any(is_within(path, store) for store in stores)]


def unhideable_store(stores: Iterable[str], *, needed: Iterable[str],
                     read_by_all: Iterable[str], mounts: bool, what: str) -> str | None:
    """Why one of `stores` (those that exist) cannot be kept from a child, or None: one that
    is or holds a path the child `needed` to run (the interpreter, its libraries) would
    break it; one inside a folder every child reads (`read_by_all`: system folders, the
    interpreter's) is hidden only under a mount, which a host without mount namespaces
    cannot give."""
    needed, read_by_all = list(needed), list(read_by_all)
    for store in stores:
        if not os.path.lexists(store):
            continue
        holder = next((path for path in read_by_all if is_within(store, path)), None)
        if holder is not None and not mounts:
            return (f"{what} {store} is among what every sandbox reads to run ({holder}), and "
                    "this host gives children no mount namespace to hide it under; keep the "
                    "store elsewhere")
        held = next((path for path in needed if is_within(path, store)), None)
        if held is not None:
            return (f"{what} {store} holds {held}, which every sandbox needs to run; list "
                    "the stores inside it instead")
    return None


def sandbox_homes_folder() -> str:
    """Where sandboxes' private homes live: one folder per trusted-side uid. No sandbox
    reaches another's home, and the file toolset none of them."""
    return os.path.join(tempfile.gettempdir(), f"sandbox_kernel_ext-{os.geteuid()}")


def never_read() -> list[str]:
    """The credential list, every sandbox's home, and this machine's Jupyter runtime folder
    (its connection files hold the keys that let anyone run code in the Jupyter kernel)."""
    denied = [*credential_paths(), os.path.realpath(sandbox_homes_folder())]
    try:
        from jupyter_core.paths import jupyter_runtime_dir

        denied.append(os.path.realpath(jupyter_runtime_dir()))
    except Exception:  # jupyter_core is optional for the runner
        pass
    return denied


def never_read_inside(root: str, own: Iterable[str] = ()) -> tuple[str, ...]:
    """What a grant of the real folder `root` may not reach beneath it (never `root` itself:
    a store a policy names is its own choice): the list above, and /etc's secrets when the
    grant holds or lies in /etc. `own`: the policy's own stores (`policy_stores`), which win
    over the grant: one that is `root` or holds it hides the whole root."""
    inside = [path for path in never_read() if is_within(path, root) and path != root]
    inside += [path for path in own if is_within(path, root) or is_within(root, path)]
    if is_within("/etc", root) or is_within(root, "/etc"):
        inside += [path for path in etc_secret_paths() if path != root]
    return tuple(dict.fromkeys(inside))


def store_link_refusal(what: str, spelled: str, real: str) -> str | None:
    """Why a policy path written as `spelled`, resolving to `real`, is refused: it reached a
    store only by following a symlink (`data/settings -> ~/.ssh/config`). None when it did
    not: a store the policy names by its own path is the policy's choice."""
    if real == spelled:
        return None
    store = next((bad for bad in never_read() if is_within(real, bad)), None)
    if store is None:
        return None
    return (f"{what} leads through a symlink to {real}, inside {store}, which no sandbox "
            "reads; name the store by its own path if that is meant")
