"""The chat page mainline llama.cpp's server embeds (`http://127.0.0.1:8080/`): its tree's `tools/ui`, a
Svelte app, built from the tree's own sources and lock file, kept in the cache by the sources' hash, and
handed to the image build as the `chat-page` context (contract.CHAT_PAGE_CONTEXT), which the build puts
where the tree's CMake looks first for prebuilt assets (`tools/ui/dist`).

The tree is not moe-stack's (a `--source` tree, an sdist, any git ref): its build script and every
devDependency are its code, and none of it runs on the host. Here npm only downloads: `npm ci
--ignore-scripts` in a directory holding nothing but the app's package.json and lock file (no project
.npmrc, no other file of the tree), after a check that every package in the lock is a registry tarball
with an integrity hash (a git dependency is cloned and prepared, its scripts run, even under
--ignore-scripts). The build, `npm run build`, runs in a container of Debian's Node.js and npm made from
the Debian base (`builder_image`): no network, a non-root user, a read-only root, every capability
dropped, no new privileges, bounded processes, memory and CPUs, an environment of its own (no variable
of the caller's), and one mount, a writable copy of `tools/ui` with the downloaded packages
(`SandboxRun`). What it writes comes back as
plain files, walked without following a link (`copy_output`).

Left to itself the pinned tree fetches prebuilt assets from a Hugging Face bucket at build time (an
offline build then has no page: "UI: no assets available"), or runs npm inside the build; the images
configure with LLAMA_USE_PREBUILT_UI=OFF, so what they embed is what was built here. A build from a git
ref fetches the page's directory at that ref first (`fetched_ui`). A host without npm or Docker, or one
that can't reach the repository, gets an image without the page, and says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from builder.container_start import start_container
from builder.contract import IMAGE_UID, LABEL_PREFIX, LOCAL_ONLY
from builder.docker_client import docker
from builder.errors import MoeStackError
from builder.files import cache_dir, content_dir
from builder.images.baseimage import ensure_base
from builder.images.build_plan import BuildPlan, stream_build
from builder.images.render import template_environment
from builder.platform.flags import flag_args

# What the build step leaves out of the sources' hash and copy, at the app's top level: npm's install
# and earlier outputs.
_NOT_SOURCES = {"node_modules", "dist", ".svelte-kit", "build"}
NPM_TIMEOUT_S = 1200
# The only files of the tree the host's npm sees: what `npm ci` needs to download the packages.
INSTALL_FILES = ("package.json", "package-lock.json")
BUILDER_REPOSITORY = f"{LOCAL_ONLY}chat-page-builder"
SANDBOX_DIR = "/ui"  # where the build's container sees its copy of tools/ui
SANDBOX_OUT = f"{SANDBOX_DIR}/dist"
# The build's whole environment (beside Docker's PATH and HOSTNAME): nothing of the caller's.
SANDBOX_ENV = {
    "HOME": "/tmp",  # npm's cache and logs, on the container's own tmpfs
    "LLAMA_UI_OUT_DIR": SANDBOX_OUT,  # the tree's svelte.config.js and vite plugins write here
    "NPM_CONFIG_UPDATE_NOTIFIER": "false",  # no registry to ask, without a network
}
# More than this is not a chat page (the page is about 3 MB).
# What the build may take of the host: a fork bomb, a runaway allocation or a busy loop in a hostile build
# script stops at these (the pinned tree's build: 98 s on 2 cores, bench/results/chat-page-2026-12-02).
SANDBOX_PIDS = 1024
SANDBOX_MEMORY = "4g"  # swap included
MAX_PAGE_BYTES = 256 << 20
MAX_PAGE_ENTRIES = 10_000


class NoPage(Exception):
    """Why this image goes without the page: one line, after "no chat page in this image: "."""


def chat_page(ui: Path, show: Callable[[str], None], base: str | None = None) -> Path | None:
    """The built page of the app in `ui` (a directory holding index.html), from the cache or built now;
    None where `ui` holds no app or it can't be built (`show` says why). `base`: the Debian image the
    build's container is made from (None: the project's base, `ensure_base`)."""
    if not (ui / "package-lock.json").is_file():
        return None
    built = cache_dir() / "chat-page" / sources_hash(ui)
    if (built / "index.html").is_file():
        return built
    npm = shutil.which("npm")
    if npm is None:
        show("no chat page in this image: npm is not installed here (Debian: apt-get install npm)")
        return None
    built.parent.mkdir(parents=True, exist_ok=True)
    show(f"building the chat page from {ui}: packages downloaded here, the build run in a container")
    try:
        # The build's user may leave what the caller can't remove: a leftover is no reason to fail.
        with tempfile.TemporaryDirectory(
            prefix=".build-", dir=built.parent, ignore_cleanup_errors=True
        ) as tmp:
            page = _build(ui, Path(tmp), npm, base, show)
            try:
                page.rename(built)
            except OSError:  # another build finished it first: theirs is the same page
                pass
    except NoPage as why:
        show(f"no chat page in this image: {why}")
        return None
    return built


def _build(ui: Path, tmp: Path, npm: str, base: str | None, show: Callable[[str], None]) -> Path:
    problem = lock_problem(ui / "package-lock.json")
    if problem is not None:
        raise NoPage(f"{ui / 'package-lock.json'} {problem}")
    work = tmp / "ui"
    copy_sources(ui, work)
    install_packages(npm, ui, tmp / "install").rename(work / "node_modules")
    try:
        image = builder_image(base or ensure_base(), show)
    except MoeStackError as err:
        raise NoPage(str(err)) from None
    uid, gid = sandbox_user()
    if os.getuid() == 0:  # the copy is the build's user's, to write in
        _chown_tree(work, uid, gid)
    run_sandboxed(SandboxRun(image=image, work=work, uid=uid, gid=gid), ui)
    return copy_output(work / "dist", tmp / "page")


def copy_sources(ui: Path, work: Path) -> None:
    """The build's copy of `ui`: its files and directories, links as links (one pointing out of the tree
    reaches nothing in the container, where the copy is all there is); anything else is no page."""
    try:
        shutil.copytree(
            ui,
            work,
            symlinks=True,
            ignore=lambda where, names: _NOT_SOURCES & set(names) if Path(where) == ui else set(),
            copy_function=_copy_plain_file,
        )
    except shutil.Error as err:
        first = err.args[0][0] if err.args and isinstance(err.args[0], list) and err.args[0] else err
        raise NoPage(f"{ui} can't be copied for its build ({first})") from None


def _copy_plain_file(source: str, dest: str) -> None:
    if not stat.S_ISREG(os.lstat(source).st_mode):  # a device or pipe would be read without end
        raise OSError(f"{source} is not a plain file")
    shutil.copy2(source, dest)


def lock_problem(lock: Path) -> str | None:
    """What keeps `lock` from being installed on this host, or None: every package must be a registry
    tarball with an integrity hash. A git dependency is cloned and prepared (its own install, its
    prepare script) even under --ignore-scripts, and a linked directory is the tree's own code."""
    try:
        data = json.loads(lock.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        return f"can't be read as JSON ({err})"
    packages = data.get("packages") if isinstance(data, dict) else None
    if not isinstance(packages, dict):
        return "lists no packages (lockfileVersion 1?): regenerate it with npm 7 or newer"
    for where, entry in packages.items():
        if where == "":
            continue  # the app itself
        # Bundled or not: npm ci fetches what an `inBundle` entry names too (a git URL with the user's
        # credentials, before any sandbox runs).
        resolved = entry.get("resolved") if isinstance(entry, dict) else None
        integrity = entry.get("integrity") if isinstance(entry, dict) else None
        if not (
            isinstance(resolved, str)
            and resolved.startswith("https://")
            and urllib.parse.urlsplit(resolved).path.endswith(".tgz")
            and isinstance(integrity, str)
        ):
            return (
                f"takes {where} from {resolved or 'no registry'}: only registry tarballs with an "
                "integrity hash are installed on this host (a git or directory dependency runs its code)"
            )
    return None


def install_argv(npm: str) -> list[str]:
    """The host's only npm command: download and unpack the lock's packages, run none of their scripts
    nor the app's own (preinstall, install, postinstall, prepare)."""
    return [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--prefer-offline"]


def install_packages(npm: str, ui: Path, into: Path) -> Path:
    """npm's install of `ui`'s lock file, made in `into` from its package.json and lock file alone (the
    tree's .npmrc is not read, so it can't turn scripts back on or name a program npm runs); returns its
    node_modules (packages from the npm registry, or npm's cache on a host without network)."""
    into.mkdir()
    for name in INSTALL_FILES:
        if (ui / name).is_symlink() or not (ui / name).is_file():
            raise NoPage(f"{ui / name} is not a plain file")
        shutil.copyfile(ui / name, into / name)
    try:
        subprocess.run(
            install_argv(npm), cwd=into, check=True, capture_output=True, text=True, timeout=NPM_TIMEOUT_S
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as err:
        raise NoPage(f"npm could not download the packages of {ui} ({_why(err)})") from None
    modules = into / "node_modules"
    if not modules.is_dir():
        modules.mkdir()  # a lock without packages
    return modules


def builder_image(base: str, show: Callable[[str], None]) -> str:
    """The build's container image: Debian's Node.js and npm on `base`, made once per base (its tag is a
    hash of its Dockerfile). BuildFailed (or DockerUnavailable) when it can't be made."""

    dockerfile = builder_dockerfile(base)
    tag = f"{BUILDER_REPOSITORY}:{hashlib.sha256(dockerfile.encode()).hexdigest()[:12]}"
    client = docker()
    if client.image.exists(tag):
        return tag
    show(f"making {tag}: Debian's Node.js and npm on {base}, for the chat page's build")
    context = content_dir({"Dockerfile": dockerfile}, cache_dir() / "contexts", "chat-page-builder")
    log_path = cache_dir() / "logs" / "chat-page-builder.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        stream_build(client, BuildPlan(context=context, tags=(tag,)), log, log_path, show)
    return tag


def builder_dockerfile(base: str) -> str:
    """The Dockerfile of the build's container image (dockerfiles/chat-page)."""
    return (
        template_environment()
        .get_template("chat-page/Dockerfile.j2")
        .render(
            base_image=base,
            uid=IMAGE_UID,
            labels={
                "org.opencontainers.image.title": "Debian's Node.js and npm, for moe-stack's chat page build",
                f"{LABEL_PREFIX}.base": base,
            },
        )
    )


def sandbox_user() -> tuple[int, int]:
    """Who the build runs as: the caller, so what it writes is theirs; for root, the images' own
    unprivileged user (contract.IMAGE_UID)."""
    return (os.getuid(), os.getgid()) if os.getuid() else (IMAGE_UID, IMAGE_UID)


@dataclass(frozen=True)
class SandboxRun:
    """`npm run build` in `image`, on `work` (the copy of tools/ui, the packages in its node_modules)."""

    image: str
    work: Path
    uid: int
    gid: int
    # The container's name, to remove it when the client stops waiting.
    name: str = field(default_factory=lambda: f"moe-stack-chat-page-{secrets.token_hex(6)}")
    cpus: int = field(default_factory=lambda: max(1, (os.cpu_count() or 1) - 1))

    def argv(self) -> list[str]:
        """The whole `docker run` command line: one core of the host's left to it (the build gets the rest,
        and at least one)."""
        env = [arg for key, value in SANDBOX_ENV.items() for arg in ("--env", f"{key}={value}")]
        options = {
            "--pull": "never",  # the image is made here (LOCAL_ONLY): never a Docker Hub name
            "--name": self.name,
            "--network": "none",
            "--user": f"{self.uid}:{self.gid}",
            "--tmpfs": "/tmp:rw,nosuid,nodev,size=1g",
            "--cap-drop": "ALL",
            "--security-opt": "no-new-privileges",
            "--pids-limit": str(SANDBOX_PIDS),
            "--memory": SANDBOX_MEMORY,
            "--memory-swap": SANDBOX_MEMORY,
            "--cpus": str(self.cpus),
            "--mount": f"type=bind,source={self.work},target={SANDBOX_DIR}",
            "--workdir": SANDBOX_DIR,
        }
        run = ["docker", "run", "--rm", "--read-only", *flag_args(options), *env]
        return [*run, self.image, "npm", "run", "build"]


def run_sandboxed(run: SandboxRun, ui: Path) -> None:
    """Run the build; a failure, or NPM_TIMEOUT_S passing, is no page (the container removed)."""
    finished = False

    def build() -> None:
        # A start the runtime lost may leave its container created under the name: it goes first.
        subprocess.run(["docker", "rm", "--force", run.name], capture_output=True, check=False)
        subprocess.run(run.argv(), check=True, capture_output=True, text=True, timeout=NPM_TIMEOUT_S)

    try:
        start_container(build, "the chat page's build sandbox")
        finished = True
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as err:
        raise NoPage(f"npm's build of {ui} failed in its container ({_why(err)})") from None
    finally:
        if not finished:  # the client stopped waiting (or was interrupted): the container goes too
            subprocess.run(["docker", "rm", "--force", run.name], capture_output=True, check=False)


def copy_output(output: Path, dest: Path) -> Path:
    """What the build wrote in `output`, copied into `dest` as moe-stack's own plain files (0644) and
    directories: code moe-stack doesn't trust wrote it, so it is walked through directory descriptors
    without following a link, and a link, device or pipe in it, or more than MAX_PAGE_BYTES or
    MAX_PAGE_ENTRIES of it, is no page."""
    try:
        top = os.open(output, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise NoPage(f"npm's build wrote nothing in {SANDBOX_OUT}") from None
    except OSError:
        raise NoPage(f"npm's build left {SANDBOX_OUT} as something other than a directory") from None
    try:
        _copy_dir(top, dest, output.name, _Budget())
    finally:
        os.close(top)
    if not (dest / "index.html").is_file():
        raise NoPage("npm's build wrote no index.html")
    return dest


@dataclass
class _Budget:
    bytes: int = MAX_PAGE_BYTES
    entries: int = MAX_PAGE_ENTRIES

    def spend(self, size: int, entries: int = 0) -> None:
        self.bytes -= size
        self.entries -= entries
        if self.bytes < 0 or self.entries < 0:
            raise NoPage(
                f"npm's build wrote more than {MAX_PAGE_BYTES >> 20} MiB or {MAX_PAGE_ENTRIES} files"
            )


def _copy_dir(fd: int, dest: Path, shown: str, budget: _Budget) -> None:
    dest.mkdir(mode=0o755)
    for name in sorted(os.listdir(fd)):
        budget.spend(0, 1)
        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        if stat.S_ISDIR(mode):
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            try:
                _copy_dir(child, dest / name, f"{shown}/{name}", budget)
            finally:
                os.close(child)
        elif stat.S_ISREG(mode):
            _copy_file(fd, name, dest / name, f"{shown}/{name}", budget)
        else:
            kind = "a link" if stat.S_ISLNK(mode) else "not a file or directory"
            raise NoPage(f"npm's build wrote {shown}/{name}, {kind}: its output is refused")


def _copy_file(fd: int, name: str, dest: Path, shown: str, budget: _Budget) -> None:
    source = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    try:
        if not stat.S_ISREG(os.fstat(source).st_mode):
            raise NoPage(f"npm's build replaced {shown} while it was copied: its output is refused")
        target = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            while block := os.read(source, 1 << 20):
                budget.spend(len(block))
                os.write(target, block)
        finally:
            os.close(target)
    finally:
        os.close(source)


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    for where, dirs, files in os.walk(root):  # not into linked directories
        for name in [*dirs, *files]:
            os.chown(Path(where) / name, uid, gid, follow_symlinks=False)
    os.chown(root, uid, gid)


def fetched_ui(url: str, ref: str, ui_dir: str, show: Callable[[str], None]) -> Path | None:
    """`ui_dir` of the git repository `url` at `ref`, fetched into the cache for a build from a git ref
    (whose tree is cloned inside the build, out of reach here): a partial clone that fetches the
    history's commits and trees but only that directory's files. None (and why, to `show`) when git
    can't reach `url` or has no such ref."""
    digest = hashlib.sha256(f"{url}\0{ref}".encode()).hexdigest()[:16]
    checkout = cache_dir() / "chat-page" / "git" / digest
    if (checkout / ui_dir / "package-lock.json").is_file():
        return checkout / ui_dir
    git = shutil.which("git")
    if git is None:
        show("no chat page in this image: git is not installed here, to fetch its sources")
        return None
    checkout.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=checkout.parent) as tmp:
        work = Path(tmp) / "repo"
        steps = [
            ["clone", "--quiet", "--filter=blob:none", "--no-checkout", url, str(work)],
            ["-C", str(work), "checkout", "--quiet", ref, "--", ui_dir],
        ]
        try:
            for step in steps:
                subprocess.run(
                    [git, *step], check=True, capture_output=True, text=True, timeout=NPM_TIMEOUT_S
                )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
            show(f"no chat page in this image: git could not fetch {ui_dir} of {url} at {ref} ({_why(err)})")
            return None
        try:
            work.rename(checkout)
        except OSError:  # fetched by another build meanwhile
            pass
    return checkout / ui_dir


def sources_hash(ui: Path) -> str:
    """A hash of the page's sources (paths and bytes; a link by where it points), so a tree with other
    sources builds anew."""
    digest = hashlib.sha256()
    for path in sorted(
        p
        for p in ui.rglob("*")
        if (p.is_symlink() or p.is_file()) and p.relative_to(ui).parts[0] not in _NOT_SOURCES
    ):
        content = b"-> " + os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        digest.update(str(path.relative_to(ui)).encode() + b"\0" + content + b"\0")
    return digest.hexdigest()[:16]


def _why(err: Exception) -> str:
    if isinstance(err, subprocess.CalledProcessError):
        lines = [line for line in (err.stderr or err.stdout or "").splitlines() if line.strip()]
        return lines[-1][-200:] if lines else f"exit {err.returncode}"
    return str(err)
