"""What no sandbox ever reads: the credential stores of every home folder and of the system,
and the secrets of /etc.

One list for every way a sandbox reaches the host: the runner hides these from confined
children (`runner/trusted/plan.py`), and the file toolset refuses them inside its roots
(`files/host_backend.py`), so one policy gives one answer whichever way it is used.
"""

from __future__ import annotations

import os
import stat
import tempfile

from .paths import is_within

__all__ = [
    "HOME_CREDENTIAL_PATHS", "SYSTEM_CREDENTIAL_PATHS", "ETC_SECRET_PATHS", "credential_paths",
    "home_folders", "etc_entry_is_secret", "etc_secret_paths", "sandbox_homes_folder",
    "never_read", "never_read_inside", "store_link_refusal",
]

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
    """A listed secret, a secret-looking name, or something a stranger may not read anyway."""
    if relpath in ETC_SECRET_PATHS or any(marker in name.lower() for marker in ETC_SECRET_MARKERS):
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
    # code hosts and git
    ".netrc", ".authinfo", ".authinfo.gpg", ".git-credentials", ".config/git/credentials",
    ".config/gh", ".config/hub", ".config/glab-cli",
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
    ".viminfo",
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
    """The built-in deny list, as absolute paths whether or not they exist now: the folders
    above each store resolved, the store's own name not (a link planted at a store's name,
    `~/.aws -> /usr`, must not make its target denied; a store it points at is on the list
    under its own name)."""
    paths = [os.path.join(home, name) for home in home_folders() for name in HOME_CREDENTIAL_PATHS]
    paths += SYSTEM_CREDENTIAL_PATHS
    return sorted({os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
                   for path in paths})


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


def never_read_inside(root: str) -> tuple[str, ...]:
    """What a grant of the real folder `root` may not reach beneath it (never `root` itself:
    a store a policy names is its own choice): the list above, and /etc's secrets when the
    grant holds or lies in /etc."""
    inside = [path for path in never_read() if is_within(path, root) and path != root]
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
