"""The guardian: every tool call is judged allow · needs approval · forbid before it runs.

The decision comes from a policy people can read and edit, never from the model: the
lists (allowlist, approval and forbidden commands with their reasons, credential
paths, protected folders, package-manager subcommands, max_delete_files) live in
config/policy.toml plus a deployment's overlay (<data dir>/policy.toml), loaded and
merged by core/policy.py. This module is the engine that applies them, and the
knowledge of how particular programs read their arguments (which options of curl
upload, what `find -exec` runs, which wrappers run the command after them).

Shell commands are parsed with bashlex, never grepped: the engine walks the syntax
tree (pipelines, lists, subshells, substitutions, redirections, functions, loops) and
follows commands into `sh -c '…'`, `eval`, `xargs`, `sudo`/`env`/`timeout`-style
wrappers and `find -exec`. Every simple command is judged on its own; the strictest
verdict wins and its reason names the part that caused it.

Before a command's checks run, its options are normalised once: `OPTION_SPECS` here
says how each program reads them (which take a value, clusters, abbreviations), and
the policy's `[options.<program>]` says what they do (run a program, write a path,
name a settings file). `-C/dir`, `-xzf`, `--opt=value` and an unambiguous `--post-f`
reach every check as `-C /dir`, `-x -z -f`, `--opt value` and `--post-file`. A program
can always have an option these tables lack; the sandbox (core/sandbox.py) is what
enforces, and this module is what asks up front and explains.

The overlay may add exact always-allow rules (the "Always allow" button); they lift
an approval to allow but never a forbid, which always wins. The policy files
themselves cannot be changed by a tool call: the agent may not change its own rules.

It is fail-closed: a policy that cannot be loaded refuses every call (with the file,
key and fix in the reason), text bashlex cannot parse is refused, a command name
computed at run time needs approval, any error or a check slower than the timeout
is refused.
"""

from __future__ import annotations

import asyncio
import fnmatch
import glob
import itertools
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import bashlex

from core.policy import (
    AlwaysAllowRule,
    Policy,
    PolicyError,
    Subcommands,
    builtin_path,
    merge,
    overlay_text_with_rule,
    overlay_text_without_rule,
    read_document,
    rule_id,
    rule_match,
)
from memory.atomic import atomic_write_text


class Verdict(StrEnum):
    ALLOW = "allow"
    APPROVAL = "approval"
    FORBID = "forbid"


_RANK = {Verdict.ALLOW: 0, Verdict.APPROVAL: 1, Verdict.FORBID: 2}


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    #: One line a person can judge (shown on the approval buttons and to the model).
    reason: str
    #: For an approval, what the command needs beyond the OS sandbox (core/sandbox.py):
    #: "network", "write:PATH", or "unsandboxed"; empty means "unsandboxed" (what the
    #: guardian cannot name is asked for as the widest grant).
    needs: tuple[str, ...] = ()


# ════════════════════════════════════════════════════════════════════════════════
# Engine knowledge: how programs read their arguments. The lists people edit (allowlist,
# approval and forbidden commands, credentials, protected folders, subcommands) are in
# config/policy.toml and reach the engine as a `Policy` (core/policy.py).
# ════════════════════════════════════════════════════════════════════════════════

_INSTALL = "installs packages"
#: Approval reasons (config/policy.toml) whose commands need the network and nothing
#: else the sandbox withholds: their approval grants exactly that.
_NETWORK_REASONS = frozenset(
    {
        _INSTALL,
        "pushes commits to a remote repository",
        "publishes a package to a registry",
        "downloads and runs a package",
        "connects to a remote host",
        "copies files to or from a remote host",
        "transfers files with a remote host",
        "opens raw network connections",
        "sends mail",
    }
)


def _needs(reason: str) -> tuple[str, ...]:
    return ("network",) if reason in _NETWORK_REASONS else ()


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# ── Places and devices. ──────────────────────────────────────────────────────────
#: Raw disks and partitions: writing here destroys a filesystem.
BLOCK_DEVICE_RE = re.compile(
    r"^/dev/(?:sd[a-z]|hd[a-z]|vd[a-z]|xvd[a-z]|nvme\d|mmcblk\d|md\d|dm-\d|loop\d|sr\d"
    r"|r?disk\d|mapper/|disk/|root$)"
)
#: Kernel interfaces where one write crashes or corrupts the machine.
KERNEL_FILE_RE = re.compile(r"^/(?:dev/(?:mem|kmem|port)|proc/sysrq-trigger|proc/kcore)$")
#: Special files that are fine to write to (or read from) anywhere.
HARMLESS_DEVICES = frozenset(
    "/dev/null /dev/zero /dev/full /dev/random /dev/urandom /dev/stdin /dev/stdout "
    "/dev/stderr /dev/tty".split()
)
HARMLESS_DEVICE_RE = re.compile(r"^/dev/fd/\d+$|^/proc/self/fd/\d+$")
#: Folders whose programs are the ordinary system ones: `/usr/bin/rm` is judged as `rm`.
SYSTEM_BIN_DIRS = frozenset("/bin /sbin /usr/bin /usr/sbin /usr/local/bin /usr/local/sbin".split())

#: `<tool> <sub> <command…>` runs <command…> (judged on its own).
RUNNER_SUBCOMMANDS = frozenset(
    {("uv", "run"), ("poetry", "run"), ("pipenv", "run"), ("pdm", "run")}
)

#: git clone options followed by a value (so the value is not taken for the target folder).
GIT_CLONE_VALUE_OPTIONS = _names(
    """-b --branch --depth -o --origin -j --jobs --reference --filter --template
    --separate-git-dir -c --config -u --upload-pack --shallow-since --shallow-exclude"""
)
#: systemctl subcommands that stop the machine, and those that only read.
SYSTEMCTL_FORBIDDEN = _names("poweroff reboot halt kexec emergency rescue suspend hibernate")
SYSTEMCTL_READ = _names(
    "status list-units list-unit-files show is-active is-enabled cat list-timers"
)
#: git config keys that cannot make git run a program.
GIT_SAFE_CONFIG = re.compile(
    r"^(?:user\.\w+|color\..+|init\.defaultbranch|pull\.rebase|pull\.ff|push\.default"
    r"|core\.autocrlf|core\.filemode|core\.ignorecase|core\.quotepath|advice\..+"
    r"|merge\.conflictstyle|diff\.algorithm|fetch\.prune|rebase\.autostash|branch\..+\.\w+"
    r"|remote\..+\.(?:url|fetch))$",
    re.IGNORECASE,
)

# ── Network. ─────────────────────────────────────────────────────────────────────
#: Programs whose output comes from the network; piping it into an interpreter is refused.
DOWNLOADERS = frozenset("curl wget fetch aria2c http https httpie xh lwp-request GET".split())
#: Programs that turn hidden text back into runnable code (`base64 -d | sh`).
DECODERS = frozenset("base64 base32 basenc xxd uudecode openssl".split())
CURL_UPLOAD_OPTIONS = frozenset(
    """-d --data --data-raw --data-binary --data-urlencode --data-ascii --json -F --form
    --form-string -T --upload-file --url-query""".split()
)
CURL_VALUE_SHORT = frozenset("dDeEFHKoTuUwxXyYzbcACmPQtr")
CURL_VALUE_LONG = frozenset(
    """--data --data-raw --data-binary --data-urlencode --data-ascii --json --form
    --form-string --upload-file --output --output-dir --request --header --user-agent --user
    --proxy --cookie --cookie-jar --config --referer --max-time --connect-timeout --retry
    --cacert --cert --key --range --write-out --dump-header --continue-at --resolve
    --max-filesize --limit-rate --proto --url --oauth2-bearer --url-query --variable""".split()
)
WGET_UPLOAD_OPTIONS = frozenset("--post-data --post-file --body-data --body-file".split())
WGET_VALUE_SHORT = frozenset("OoaPeUtTwQiBlDAR")

# ── Shells and interpreters. ─────────────────────────────────────────────────────
SHELLS = frozenset("sh bash zsh dash ksh ash mksh fish".split())
#: interpreter -> (options whose next word is inline code, options that take a value)
INTERPRETERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "python": (frozenset({"-c"}), frozenset({"-W", "-X", "-m"})),
    "perl": (frozenset({"-e", "-E"}), frozenset({"-I", "-M", "-m"})),
    "ruby": (frozenset({"-e"}), frozenset({"-I", "-r"})),
    "node": (
        frozenset({"-e", "--eval", "-p", "--print"}),
        frozenset({"-r", "--require", "--import", "--loader", "--input-type"}),
    ),
    "php": (frozenset({"-r"}), frozenset({"-d", "-c"})),
    "lua": (frozenset({"-e"}), frozenset({"-l"})),
    "Rscript": (frozenset({"-e"}), frozenset()),
}
INTERPRETER_ALIASES = {
    "nodejs": "node",
    "python2": "python",
    "python3": "python",
    "pypy3": "python",
}

# ── Wrappers: run the command that follows them (which is judged on its own). ────
#: wrapper -> (short options taking a value, long options taking a value, extra reason or "")
WRAPPERS: dict[str, tuple[frozenset[str], frozenset[str], str]] = {
    "sudo": (
        frozenset("ugpCDhrtTUR"),
        frozenset("--user --group --prompt --close-from --chdir --host --role --type".split()),
        "runs as root (sudo)",
    ),
    "doas": (frozenset("uC"), frozenset(), "runs as root (doas)"),
    "nohup": (frozenset(), frozenset(), ""),
    "nice": (frozenset("n"), frozenset({"--adjustment"}), ""),
    "ionice": (frozenset("cnp"), frozenset({"--class", "--classdata"}), ""),
    "time": (frozenset("fo"), frozenset({"--format", "--output"}), ""),
    "stdbuf": (frozenset("ioe"), frozenset({"--input", "--output", "--error"}), ""),
    "setsid": (frozenset(), frozenset(), ""),
    "builtin": (frozenset(), frozenset(), ""),
    "exec": (frozenset("a"), frozenset(), ""),
    "unbuffer": (frozenset(), frozenset(), ""),
    "chroot": (frozenset(), frozenset({"--userspec", "--groups"}), "runs in another root folder"),
}


# ── Options: how each program reads them. ────────────────────────────────────────
@dataclass(frozen=True)
class OptionSpec:
    """How one program reads its options: the data both the normaliser and the checks use.

    Why one table: each handler used to re-parse its own options and each missed a form
    the program accepts — a value glued to its letter (`-C/dir`), letters in a cluster
    (`-Ic`), `--opt=value`, or a long option cut short (`--post-f` is `--post-file` to
    getopt_long). The normaliser rewrites every form into `-C /dir`, `-I -c`,
    `--opt value` and full names once, so a check names each option once.
    """

    #: Short options followed by a value (`-C dir`, `-Cdir`, `-xC dir`).
    short_values: frozenset[str] = frozenset()
    #: Short options with an optional value, which is then always glued (`-i.bak`, `-j4`).
    short_glued: frozenset[str] = frozenset()
    #: Long option (full name) -> "value" | "optional" (only as `--opt=value`) | "flag".
    long: dict[str, str] = field(default_factory=dict)
    #: Letters combine (`-xzf`); False for programs with one-dash words (`-Wall`, `-cols`).
    clusters: bool = True
    #: getopt_long, optparse and git take an unambiguous prefix for the whole name.
    abbreviations: bool = True
    #: Options end at the first operand (wrappers, interpreters, git before its subcommand).
    stop_at_operand: bool = False
    #: After these (and their value) the rest belongs to someone else (`python -c code …`).
    ends: frozenset[str] = frozenset()
    # What the options do comes from the policy ([options.<program>] in
    # config/policy.toml, which people read and extend), joined in by `_Analysis.spec`:
    #: Option -> what it does that a person should approve (runs a program, …).
    runs: dict[str, str] = field(default_factory=dict)
    #: Options whose value is a path the program writes (checked like a redirection).
    writes: frozenset[str] = frozenset()
    #: Options naming a settings file that can load code (plugins, `addopts`, hooks):
    #: one outside the workspace needs a person.
    configs: frozenset[str] = frozenset()

    def takes_value(self, option: str) -> bool:
        if option.startswith("--"):
            return self.long.get(option) == "value"
        return len(option) == 2 and option[1] in self.short_values


def _spec(
    short: str = "",
    long: str = "",
    *,
    clusters: bool = True,
    abbreviations: bool = True,
    stop: bool = False,
    ends: str = "",
) -> OptionSpec:
    """Read getopt-like text: short `C:` takes a value, `j::` an optional (glued) one;
    long `name=` takes a value, `name?` an optional one, a bare name is a flag."""
    values: set[str] = set()
    glued: set[str] = set()
    i = 0
    while i < len(short):
        letter = short[i]
        if short[i + 1 : i + 3] == "::":
            glued.add(letter)
            i += 3
        elif short[i + 1 : i + 2] == ":":
            values.add(letter)
            i += 2
        else:
            i += 1
    longs: dict[str, str] = {}
    for item in long.split():
        if item.endswith("="):
            longs["--" + item[:-1]] = "value"
        elif item.endswith("?"):
            longs["--" + item[:-1]] = "optional"
        else:
            longs["--" + item] = "flag"
    return OptionSpec(
        frozenset(values),
        frozenset(glued),
        longs,
        clusters,
        abbreviations,
        stop,
        frozenset(ends.split()),
    )


_GCC_LIKE = _spec(
    "o:B:I:L:D:U:x:",
    "output= specs=",
    clusters=False,
    abbreviations=False,
)
_SHELL_SPEC = _spec(
    "o:O:",
    """rcfile= init-file= norc noprofile login posix restricted verbose debugger
    dump-strings dump-po-strings help version pretty-print noediting""",
    stop=True,
)

#: Program -> how it reads its options. Programs not listed keep their words as written.
OPTION_SPECS: dict[str, OptionSpec] = {
    "make": _spec(
        "C:f:I:j::l::o:W:E:O::",
        """directory= file= makefile= include-dir= jobs? load-average? max-load? old-file=
        assume-old= what-if= new-file= assume-new= eval= debug? output-sync? shuffle?
        always-make environment-overrides ignore-errors keep-going just-print dry-run recon
        question silent quiet touch trace print-directory no-print-directory
        warn-undefined-variables no-builtin-rules no-builtin-variables check-symlink-times
        print-data-base no-keep-going stop help version""",
    ),
    "cmake": _spec(
        "C:D:U:G:T:A:S:B:P:",
        "build= install= preset= toolchain= install-prefix= graphviz= log-level= fresh",
        clusters=False,
        abbreviations=False,
    ),
    **dict.fromkeys(("gcc", "g++", "cc", "c++", "clang", "clang++"), _GCC_LIKE),
    "split": _spec(
        "a:b:C:l:n:t:",
        """suffix-length= additional-suffix= bytes= line-bytes= lines= number= separator=
        filter= numeric-suffixes? hex-suffixes? elide-empty-files unbuffered verbose""",
    ),
    "sort": _spec(
        "k:t:o:S:T:",
        """key= field-separator= output= buffer-size= temporary-directory= compress-program=
        batch-size= files0-from= parallel= random-source= sort? debug check? ignore-case
        numeric-sort reverse unique zero-terminated stable merge human-numeric-sort""",
    ),
    "tar": _spec(
        "b:C:f:F:g:H:I:K:L:N:T:V:X:",
        """to-command= checkpoint-action= use-compress-program= rsh-command= info-script=
        new-volume-script= rmt-command= index-file= directory= file= files-from=
        exclude-from= exclude= transform= xform= owner= group= mode= mtime= newer=
        after-date= format= label= checkpoint? volno-file= listed-incremental=
        absolute-names extract create list append update get gzip bzip2 xz zstd verbose
        to-stdout keep-old-files overwrite""",
    ),
    "watch": _spec(
        "n:d::q:",
        """interval= differences? exec chgexit errexit beep color no-color no-title
        precise no-wrap no-linewrap equexit=""",
        stop=True,
    ),
    "time": _spec("f:o:", "format= output= append portability verbose quiet", stop=True),
    "iconv": _spec(
        "f:t:o:",
        "from-code= to-code= output= list silent",
    ),
    "shuf": _spec(
        "i:n:o:",
        "echo input-range= head-count= output= random-source= repeat zero-terminated",
    ),
    "pip": _spec(
        "r:c:e:i:f:t:d:",
        """log= log-file= cache-dir= src= target= prefix= root= dest= requirement=
        constraint= editable= index-url= extra-index-url= find-links= python= proxy=
        timeout= retries= exists-action= cert= client-cert= trusted-host= progress-bar=
        upgrade-strategy= platform= python-version= implementation= abi= report= no-deps
        upgrade user quiet verbose no-cache-dir no-input isolated require-virtualenv
        disable-pip-version-check no-color""",
    ),
    "python": _spec(
        "c:m:W:X:",
        "help version check-hash-based-pycs=",
        abbreviations=False,
        stop=True,
        ends="-c -m",
    ),
    "perl": _spec(
        "e:E:I:M:m:l::0::i::x::C::d::D::",
        "",
        abbreviations=False,
        stop=True,
    ),
    "ruby": _spec(
        "e:I:r:E:F:C:i::x::W::",
        "",
        abbreviations=False,
        stop=True,
    ),
    "node": _spec(
        "e:p:r:",
        "eval= print= require= import= loader= experimental-loader= input-type=",
        abbreviations=False,
        stop=True,
        ends="-e --eval -p --print",
    ),
    **dict.fromkeys(
        ("awk", "gawk", "mawk", "nawk"),
        _spec(
            "f:v:F:e:i:l:E:",
            """file= assign= field-separator= source= include= load= exec= characters-as-bytes
            posix traditional lint? sandbox dump-variables? profile? pretty-print?""",
        ),
    ),
    **dict.fromkeys(
        ("chmod", "chown", "chgrp"),
        _spec("", "recursive reference= from= changes silent quiet verbose dereference"),
    ),
    "unzip": _spec("d:x:P:", "", abbreviations=False),
    "7z": _spec("o:p:t:m:x:i:", "", clusters=False, abbreviations=False),
    "zstd": _spec(
        "o:D:",
        "output-dir-flat= output-dir-mirror=",
    ),
    "patch": _spec(
        "d:o:i:p:r:B:D:F:V:Y:z:",
        "directory= output= input= strip= reject-file= prefix= suffix= basename-prefix=",
    ),
    "rsync": _spec(
        "e:f:B:T:",
        """rsh= rsync-path= filter= exclude= include= temp-dir= partial-dir= backup-dir=
        log-file= write-batch= only-write-batch= read-batch= password-file= files-from=""",
    ),
    "csplit": _spec(
        "b:f:n:",
        "suffix-format= prefix= digits=",
    ),
    **dict.fromkeys(SHELLS, _SHELL_SPEC),
    "git": _spec(
        "C:c:",
        """exec-path? git-dir= work-tree= namespace= config-env= super-prefix= paginate
        no-pager no-replace-objects bare literal-pathspecs glob-pathspecs noglob-pathspecs
        icase-pathspecs no-optional-locks list-cmds= attr-source= html-path man-path
        info-path version help""",
        stop=True,
    ),
    "wget": _spec(
        "O:o:a:P:e:U:t:T:w:Q:i:B:l:D:A:R:",
        """post-data= post-file= body-data= body-file= method= output-document=
        directory-prefix= output-file= append-output= execute= header= user-agent= user=
        password= input-file= base= tries= timeout= wait= quota= level= domains= accept=
        reject= use-askpass? config= load-cookies= save-cookies= save-headers
        ca-certificate= certificate= private-key= quiet verbose no-verbose continue
        recursive mirror spider no-check-certificate server-response""",
    ),
    "sed": _spec(
        "e:f:l:i::E",
        """expression= file= in-place? line-length= null-data zero-terminated separate
        sandbox quiet silent posix regexp-extended unbuffered debug follow-symlinks""",
    ),
    "rm": _spec(
        "",
        """force interactive? one-file-system no-preserve-root preserve-root? recursive dir
        verbose""",
    ),
    **dict.fromkeys(
        ("grep", "egrep", "fgrep", "zgrep"),
        _spec(
            "e:f:m:A:B:C:d:D:",
            """regexp= file= max-count= after-context= before-context= context= directories=
            devices= include= exclude= exclude-from= exclude-dir= label= color? colour?
            binary-files= recursive dereference-recursive ignore-case invert-match
            word-regexp line-regexp count files-with-matches files-without-match
            only-matching quiet silent no-messages byte-offset line-number with-filename
            no-filename null null-data text extended-regexp fixed-strings basic-regexp
            perl-regexp""",
        ),
    ),
    "rg": _spec(
        "e:f:g:t:T:m:A:B:C:j:M:r:E:",
        "pre= pre-glob= regexp= file= glob= iglob= type= type-not= max-count= replace=",
        abbreviations=False,
    ),
    "less": _spec(
        "o:O:b:h:j:k:p:P:t:T:x:y:z:",
        "log-file= LOG-FILE= pattern= prompt= tag= tag-file= lesskey-file=",
    ),
    "date": _spec(
        "d:f:r:s:I::",
        "date= file= reference= set= iso-8601? rfc-3339= utc universal rfc-email debug",
    ),
    "hostname": _spec(
        "F:",
        "file=",
    ),
    "zip": _spec(
        "",
        "unzip-command=",
        clusters=False,
        abbreviations=False,
    ),
    **dict.fromkeys(
        ("cp", "mv", "install", "ln"),
        _spec(
            "t:S:m:o:g:",
            """target-directory= suffix= backup? mode= owner= group= no-target-directory
            force interactive recursive archive verbose symbolic parents update? no-clobber""",
        ),
    ),
    "env": _spec(
        "u:C:S:",
        "unset= chdir= split-string= ignore-environment null debug",
        stop=True,
    ),
    "xargs": _spec(
        "a:d:E:I:L:n:P:s:i::e::l::",
        """arg-file= delimiter= eof? replace? max-lines? max-args= max-procs= max-chars=
        process-slot-var= null interactive no-run-if-empty open-tty verbose exit
        show-limits""",
        stop=True,
    ),
    "timeout": _spec("s:k:", "signal= kill-after= foreground preserve-status verbose", stop=True),
    "ps": _spec(
        "C:G:g:p:q:s:t:u:U:o:O:N",
        """pid= ppid= user= User= group= Group= sid= tty= format= sort= cols= columns= rows=
        lines= width= quick-pid= forest headers no-headers""",
        abbreviations=False,
    ),
    "hash": _spec("p:", "", abbreviations=False),
    "pytest": _spec(
        "c:k:m:p:o:",
        """junitxml= junit-xml= basetemp= rootdir= config-file= confcutdir= cache-dir=
        override-ini= log-file= report-log= resultlog= pastebin= debug? maxfail=
        durations= tb= import-mode= pyargs""",
    ),
    "tree": _spec("o:L:P:I:", "", abbreviations=False),
    "ninja": _spec("C:f:j:k:l:t:d:w:", "", abbreviations=False),
    "sdiff": _spec(
        "o:w:",
        "output= width=",
    ),
    "man": _spec(
        "P:H::l:M:m:C:S:s:L:R:",
        "pager= html? config-file= manpath= sections= locale=",
    ),
    "mypy": _spec(
        "c:m:p:",
        """cache-dir= config-file= junit-xml= html-report= txt-report= xml-report=
        linecount-report= any-exprs-report= cobertura-xml-report= lineprecision-report=
        xslt-html-report= xslt-txt-report= python-executable=""",
    ),
    "coverage": _spec(
        "d:o:",
        "directory= data-file= rcfile= output=",
    ),
    "tsc": _spec(
        "p:",
        "outDir= outFile= declarationDir= tsBuildInfoFile= project=",
        abbreviations=False,
    ),
    "eslint": _spec(
        "c:o:f:",
        "config= output-file= cache-location= rulesdir= resolve-plugins-relative-to= format=",
        abbreviations=False,
    ),
    "prettier": _spec(
        "c:",
        "config= plugin= cache-location= ignore-path=",
        abbreviations=False,
    ),
    "ruff": _spec(
        "o:",
        "config= cache-dir= output-file= target-version= extend-select= select= ignore=",
        abbreviations=False,
    ),
    **dict.fromkeys(
        ("black", "isort"),
        _spec(
            "l:t:",
            "config= settings-path= settings-file= line-length=",
        ),
    ),
    "history": _spec("d:", "", abbreviations=False),
    "yq": _spec("i", "inplace from-file= output-format= input-format=", abbreviations=False),
}
for _name, (_short_values, _long_values, _) in WRAPPERS.items():
    OPTION_SPECS.setdefault(
        _name,
        _spec(
            "".join(f"{c}:" for c in sorted(_short_values)),
            " ".join(f"{x[2:]}=" for x in sorted(_long_values)),
            stop=True,
        ),
    )

#: git subcommand -> how it reads its options (the global ones are under "git" above).
_GIT_NETWORK = _spec(
    "u:o:b:j:c:",
    """upload-pack= receive-pack= exec= config= template= origin= branch= depth= jobs=
    reference= filter= separate-git-dir= shallow-since= shallow-exclude= recurse-submodules?
    server-option= push-option= repo= remote= all tags prune force dry-run quiet verbose
    set-upstream rebase? ff-only no-ff mirror bare""",
)
_GIT_DIFF = _spec(
    "n:o:U:M::C::S:G:O:",
    """output= output-directory= output-indicator-new= output-indicator-old=
    output-indicator-context= ext-diff no-ext-diff textconv no-textconv max-count= skip=
    since= until= after= before= author= committer= grep= format= pretty? stat? oneline
    patch name-only name-status color? word-diff? diff-filter= relative? src-prefix=
    dst-prefix= abbrev? unified= inter-hunk-context= function-context numstat shortstat
    cached staged""",
)
GIT_SUBCOMMAND_SPECS: dict[str, OptionSpec] = {
    **dict.fromkeys(
        ("clone", "fetch", "pull", "push", "ls-remote", "remote", "submodule"), _GIT_NETWORK
    ),
    **dict.fromkeys(
        ("diff", "log", "show", "format-patch", "whatchanged", "range-diff", "shortlog"),
        _GIT_DIFF,
    ),
    "archive": _spec(
        "o:",
        "output= remote= exec= format= prefix= add-file= add-virtual-file= list verbose",
    ),
    "grep": _spec(
        "e:f:m:A:B:C:O::",
        """open-files-in-pager? max-depth= threads= context= after-context= before-context=
        max-count= file= and or not untracked no-index cached recurse-submodules
        ignore-case word-regexp invert-match line-number count files-with-matches""",
    ),
    "rebase": _spec(
        "x:s:X:",
        """exec= onto= strategy= strategy-option= interactive autosquash autostash continue
        abort skip root""",
    ),
    "init": _spec(
        "b:",
        "template= separate-git-dir= initial-branch= shared? object-format= bare quiet",
    ),
    "apply": _spec(
        "p:C:",
        "directory= unsafe-paths index cached check stat reverse reject",
    ),
    "commit": _spec(
        "m:F:C:c:t:",
        """message= file= template= reuse-message= reedit-message= author= date= fixup=
        squash= cleanup= trailer= all amend no-edit no-verify signoff allow-empty quiet""",
    ),
}

#: `python -m MODULE` with these modules is ordinary work; any other module needs a
#: person (each module has its own options: http.server serves files, zipfile writes).
PYTHON_MODULES_OK = frozenset(
    "pytest unittest doctest mypy ruff black isort flake8 pylint pyright coverage timeit"
    " tabnanny pyflakes pydoc_data this".split()
)
#: Shell built-ins that evaluate an array subscript in their argument as arithmetic, so a
#: literal `a[$(cmd)]` runs cmd (`test -v`, `printf -v`, `[[ … -eq … ]]`, `read`, …).
SUBSCRIPT_BUILTINS = frozenset(
    "test [ [[ printf declare typeset local read unset let export readonly mapfile readarray"
    " wait".split()
)
#: Built-ins that set or export a variable named by an argument (`read PATH`,
#: `declare -x LESSOPEN=…`, `export LD_PRELOAD` after setting it some other way).
VARIABLE_SETTERS = frozenset(
    "export declare typeset local readonly read printf mapfile readarray getopts".split()
)
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ARITHMETIC_TESTS = frozenset("-eq -ne -lt -le -gt -ge".split())
#: `$#`, `$?`, `${#x}`, `$$`, `$!`: always a number.
_SPECIAL_PARAM_RE = re.compile(r"^\"?\$(?:[#?$!]|\{#[^}]*\})\"?$")
_SUBSCRIPT_CODE_RE = re.compile(r"\[[^\]]*(?:\$\(|`|\$\{)")

#: Commands that delete or modify their arguments (for `xargs rm`, `find -exec rm`).
DESTRUCTIVE = frozenset(
    "rm rmdir unlink shred mv cp chmod chown chgrp ln truncate dd kill tee touch".split()
)

MAX_DEPTH = 8
MAX_GLOB_MATCHES = 200
#: Shell scripts in the workspace up to this size are read and judged by their content.
MAX_SCRIPT_BYTES = 256_000
_ARITH = "__steward_arith_"
#: `[[ … ]]` is judged as `[ … ]` (bashlex cannot parse it; what runs inside is the same).
_DOUBLE_BRACKET_RE = re.compile(r"(?:(?<=^)|(?<=[\s;&|(!]))\[\[(?=\s)|(?<=\s)\]\](?=$|[\s;&|)])")
MAX_LOOP_ITEMS = 8
_GLOB_CHARS = set("*?[{")

#: The classic fork bomb and its renamed forms, caught on the raw text as well.
FORK_BOMB_RE = re.compile(
    r"(?:^|[\s;&|])(?:function\s+)?([\w:.-]+)\s*\(\s*\)\s*\{[^}]*?(?<![\w.:-])"
    r"(?:\1\s*\|\s*&?\s*\1(?![\w.:-])|\1\s*&(?!&))"
)
_QUOTED_HEREDOC_RE = re.compile(r"(?<!<)<<(?!<)(-?)\s*(?:'([^'\n]+)'|\"([^\"\n]+)\"|\\(\w+))")
_TIME_RE = re.compile(r"(^|[;&|(){}\n]|\$\()(\s*)time(?=\s)")


# ════════════════════════════════════════════════════════════════════════════════
# The engine.
# ════════════════════════════════════════════════════════════════════════════════


class _Unparseable(Exception):
    """Text the parser cannot handle; the caller refuses it (fail-closed)."""


@dataclass
class _Word:
    """One word of a command: as written, and its value where it is known before running."""

    raw: str
    #: After expanding ~, known variables and `$(echo x)`; None when only known at run time.
    value: str | None
    node: Any = None

    @property
    def text(self) -> str:
        return self.value if self.value is not None else self.raw


@dataclass
class _Flow:
    """What flows into a command's stdin (or out of a pipeline stage)."""

    #: "network" (a download), "decoded" (base64 -d and friends) or None.
    taint: str | None = None
    #: The exact text when it is known (heredoc, `echo ls |`), for sh to be judged on it.
    text: str | None = None
    #: A file read with `<`.
    path: _Word | None = None
    #: Something comes in at all (a pipe or a redirection).
    present: bool = False


@dataclass
class _Scope:
    cwd: str | None
    vars: dict[str, str | None] = field(default_factory=dict)
    functions: set[str] = field(default_factory=set)
    depth: int = 0

    def child(self, *, deeper: bool = False) -> _Scope:
        return _Scope(self.cwd, dict(self.vars), set(self.functions), self.depth + deeper)


@dataclass
class _Path:
    shown: str
    lexical: str | None  # absolute, normalised; None when unknown
    real: str | None  # symlinks resolved
    glob: bool = False  # had glob characters: lexical/real name the folder they expand in


@dataclass
class _Cmd:
    """A simple command with its words resolved, ready for the rule handlers."""

    name: str
    words: list[_Word]  # words[0] is the command itself
    snippet: str
    scope: _Scope
    stdin: _Flow

    @property
    def args(self) -> list[_Word]:
        return self.words[1:]


def _plain(text: str) -> bool:
    """Option letters as written, with no quote or expansion inside (`--$x` is not)."""
    return re.fullmatch(r"-{1,2}[A-Za-z0-9][A-Za-z0-9_.+-]*", text) is not None


def _value_word(word: _Word, start: int) -> _Word:
    """The part of `word` from `start` on, as a word of its own (`-C/dir` → `/dir`)."""
    if word.value is not None:
        return _Word(word.value[start:], word.value[start:], word.node)
    return _Word(word.raw[start:], None, word.node)


def _long_name(name: str, spec: OptionSpec) -> tuple[str, list[str]]:
    """`--post-f` → `--post-file` where the prefix names one known option; else the
    name as written and, when the prefix fits several, those candidates."""
    if name in spec.long or not spec.abbreviations:
        return name, []
    hits = [full for full in spec.long if full.startswith(name)]
    if len(hits) == 1:
        return hits[0], []
    return name, hits


def normalise_options(
    words: list[_Word], spec: OptionSpec, ambiguous: Callable[[str, list[str]], None]
) -> list[_Word]:
    """Rewrite a program's arguments into one form: `-C /dir`, `-I -c`, `--opt value`, and
    full long names. Operands and anything the spec does not know are kept as written.

    `ambiguous` hears about a prefix that fits several known options (the program
    refuses those, unless it knows an option we do not: the caller decides).
    """
    out: list[_Word] = []
    i, n = 0, len(words)
    while i < n:
        word = words[i]
        text = word.text
        if text == "--":
            out.extend(words[i:])
            break
        if text.startswith("--") and len(text) > 2:
            name, eq, _ = text.partition("=")
            if not _plain(name):
                out.append(word)
                i += 1
                continue
            full, hits = _long_name(name, spec)
            if hits:
                ambiguous(name, hits)
            kind = spec.long.get(full)
            if eq and kind == "value":
                out += [_Word(full, full), _value_word(word, len(name) + 1)]
            elif not eq and kind == "value" and i + 1 < n:
                out += [_Word(full, full), words[i + 1]]
                i += 1
            elif full != name:
                rest = _value_word(word, len(name))
                joined = full + (rest.value if rest.value is not None else rest.raw)
                out.append(_Word(joined, joined if rest.value is not None else None, word.node))
            else:
                out.append(word)
            if full in spec.ends:
                out.extend(words[i + 1 :])
                break
            i += 1
            continue
        if text.startswith("-") and len(text) > 1 and not text[1].isdigit():
            pieces, consumed, end = _short_cluster(words, i, spec)
            out += pieces
            i += 1 + consumed
            if end:
                out.extend(words[i:])
                break
            continue
        if spec.stop_at_operand and not text.startswith("+"):
            out.extend(words[i:])
            break
        out.append(word)
        i += 1
    return out


def _short_cluster(words: list[_Word], i: int, spec: OptionSpec) -> tuple[list[_Word], int, bool]:
    """Split `-xzfout.tgz` / `-Cdir` / `-Ic`: (words, next words used as a value, ends)."""
    word = words[i]
    text = word.text
    letters = text[1:]
    if not spec.clusters:
        if text[1] in spec.short_values and text[:2] not in spec.long:
            if len(text) > 2 and _plain(text[:2]):
                return [_Word(text[:2], text[:2]), _value_word(word, 2)], 0, False
            if len(text) == 2 and i + 1 < len(words):
                return [word, words[i + 1]], 1, False
        return [word], 0, False
    pieces: list[_Word] = []
    for k, letter in enumerate(letters):
        if not letter.isalnum():  # a quote or `$` inside: keep the word as written
            return [word], 0, False
        option = "-" + letter
        if letter in spec.short_values:
            pieces.append(_Word(option, option))
            used = 0
            if k + 2 < len(text):
                pieces.append(_value_word(word, k + 2))
            elif i + 1 < len(words):
                pieces.append(words[i + 1])
                used = 1
            return pieces, used, option in spec.ends
        if letter in spec.short_glued:
            pieces.append(_Word(option, option))
            if k + 2 < len(text):
                rest = _value_word(word, k + 2)
                glued = option + (rest.value if rest.value is not None else rest.raw)
                pieces[-1] = _Word(glued, glued if rest.value is not None else None, word.node)
            return pieces, 0, False
        pieces.append(_Word(option, option))
    return pieces, 0, False


def _operands(words: list[_Word], spec: OptionSpec) -> list[_Word]:
    """The operands of normalised words: options and their values left out."""
    out: list[_Word] = []
    i = 0
    while i < len(words):
        text = words[i].text
        if text == "--":
            return out + words[i + 1 :]
        if text.startswith("-") and text != "-":
            i += 2 if spec.takes_value(text) else 1
            continue
        out.append(words[i])
        i += 1
    return out


def _git_runs_it(path: str | None) -> bool:
    """Is `path` a git repository's config, a hook, or the `.git` entry itself (a `.git`
    file may point anywhere with `gitdir:`)? Writing them turns a later `git status`
    or `git commit` into any program."""
    if path is None:
        return False
    parts = path.split("/")
    if ".git" not in parts:
        return False
    after = parts[len(parts) - parts[::-1].index(".git") :]
    return (
        not after
        or after[-1] == "config"
        or "hooks" in after
        or after[:2] == ["info", "attributes"]
    )


def _risky_env(policy: Policy, name: str) -> bool:
    """Listed in [environment] risky, exactly or under a `PREFIX*` entry (GIT_CONFIG_*)."""
    if name in policy.risky_env_vars:
        return True
    return any(
        entry.endswith("*") and name.startswith(entry[:-1]) for entry in policy.risky_env_vars
    )


def _rank(v: Verdict) -> int:
    return _RANK[v]


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _kind(node: Any) -> str:
    return getattr(node, "kind", "")


def _norm(path: str) -> str:
    out = os.path.normpath(path)
    return "/" + out.lstrip("/") if out.startswith("//") else out


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _embedded_commands(text: str) -> list[str]:
    """The `$(…)` and backtick commands inside text bashlex leaves unparsed (heredocs, ${…})."""
    found: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "`":
            end = text.find("`", i + 1)
            if end < 0:
                raise _Unparseable("unterminated backtick")
            found.append(text[i + 1 : end])
            i = end + 1
            continue
        if text.startswith("$(", i):
            if text.startswith("$((", i):
                raise _Unparseable("arithmetic expansion is not supported")
            depth, j = 1, i + 2
            quote = ""
            while j < len(text) and depth:
                c = text[j]
                if c == "\\":
                    j += 2
                    continue
                if quote:
                    quote = "" if c == quote else quote
                elif c in "'\"":
                    quote = c
                elif c == "(":
                    depth += 1
                elif c == ")":
                    depth -= 1
                j += 1
            if depth:
                raise _Unparseable("unbalanced $( in text")
            found.append(text[i + 2 : j - 1])
            i = j
            continue
        i += 1
    return found


def _expand_braces(text: str, limit: int = 32) -> list[str]:
    """`a/{b,c}/d` → [a/b/d, a/c/d] (innermost first; enough to see what a glob can reach)."""
    out = [text]
    for _ in range(limit):
        nxt: list[str] = []
        changed = False
        for item in out:
            m = re.search(r"\{([^{}]*,[^{}]*)\}", item)
            if m is None:
                nxt.append(item)
                continue
            changed = True
            nxt.extend(item[: m.start()] + alt + item[m.end() :] for alt in m.group(1).split(","))
        out = nxt[:limit]
        if not changed:
            break
    return out


def _glob_matches(pattern: str, path: str) -> bool:
    """Shell-style: `*` stays within one folder and does not match a leading dot."""
    pat_parts, path_parts = pattern.split("/"), path.split("/")
    if len(pat_parts) != len(path_parts):
        return False
    for pat, part in zip(pat_parts, path_parts, strict=True):
        if part.startswith(".") and not pat.startswith("."):
            return False
        if not fnmatch.fnmatchcase(part, pat):
            return False
    return True


def _iter_nodes(node: Any) -> Iterator[Any]:
    """Every bashlex node below `node` (words, substitutions, heredocs included)."""
    stack = [node]
    while stack:
        current = stack.pop()
        if current is None or isinstance(current, str | int):
            continue
        yield current
        for attr in ("parts", "list"):
            stack.extend(getattr(current, attr, None) or [])
        for attr in ("command", "output", "heredoc"):
            child = getattr(current, attr, None)
            if child is not None and not isinstance(child, str | int):
                stack.append(child)
        stack.extend(getattr(current, "redirects", None) or [])


def _taint_of(nodes: list[Any]) -> str | None:
    """Does any substitution here download ("network") or decode ("decoded") text?"""
    taint = None
    for node in nodes:
        for sub in _iter_nodes(node):
            if _kind(sub) != "word":
                continue
            name = os.path.basename(sub.word)
            if name in DOWNLOADERS:
                return "network"
            if name in DECODERS:
                taint = "decoded"
    return taint


def _subst_nodes(word: _Word) -> list[Any]:
    if word.node is None:
        return []
    return [
        p
        for p in _iter_nodes(word.node)
        if _kind(p) in ("commandsubstitution", "processsubstitution")
    ]


class _Analysis:
    """One shell command's walk: collects findings; the strictest one is the decision."""

    def __init__(
        self,
        root: str,
        home: str,
        policy: Policy,
        guarded: frozenset[str] = frozenset(),
        private: frozenset[str] = frozenset(),
    ) -> None:
        self.root = root
        self.home = home
        self.policy = policy
        self.protected = policy.protected_dirs | {home}
        #: The policy files themselves (real and lexical paths): changing them is refused.
        self.guarded = guarded
        #: Steward's own data dir (lexical and real): approvals, access list, memory.
        self.private = private
        self.findings: list[Decision] = []
        self.downloaded: set[str] = set()
        self.src = ""
        self.quoted_heredocs: set[str] = set()
        self.ifs_changed = False
        #: Option specs with the policy's risks joined in, per program (see `spec`).
        self._specs: dict[str, OptionSpec | None] = {}
        #: The text had `[[ … ]]`, judged as `[ … ]`, whose -eq/-lt… evaluate arithmetic.
        self.double_bracket = False
        #: Files this command writes before it may run them: real path -> text (None: unknown).
        self.written: dict[str, str | None] = {}
        #: `$((…))` expressions, replaced by placeholder variables before parsing.
        self.arith: list[str] = []

    # ── findings ────────────────────────────────────────────────────────────────
    def flag(self, verdict: Verdict, reason: str, needs: tuple[str, ...] = ()) -> None:
        self.findings.append(Decision(verdict, reason, needs))

    def decision(self) -> Decision:
        worst: Decision | None = None
        for finding in self.findings:
            if worst is None or _rank(finding.verdict) > _rank(worst.verdict):
                worst = finding
        if worst is None or worst.verdict == Verdict.ALLOW:
            return Decision(Verdict.ALLOW, "read-only or workspace-local commands only")
        if worst.verdict == Verdict.APPROVAL:  # one approval covers every finding's need
            needs: set[str] = set()
            for finding in self.findings:
                if finding.verdict == Verdict.APPROVAL:
                    needs.update(finding.needs or ("unsandboxed",))
            return Decision(worst.verdict, worst.reason, tuple(sorted(needs)))
        return worst

    # ── parsing ─────────────────────────────────────────────────────────────────
    def script(self, text: str, scope: _Scope) -> None:
        """Parse and judge a piece of shell text (the command itself, or `sh -c` / eval text)."""
        if scope.depth > MAX_DEPTH:
            self.flag(Verdict.FORBID, "commands nested too deeply to check; use a simpler form")
            return
        if not any(line.strip() and not line.strip().startswith("#") for line in text.splitlines()):
            return
        bomb = FORK_BOMB_RE.search(text)
        if bomb:
            self.flag(Verdict.FORBID, f"`{_short(bomb.group(0).strip())}…` is a fork bomb")
            return
        if re.search(r"\bIFS=", text):
            self.ifs_changed = True
        prepared = _TIME_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}\\time", text)
        if _DOUBLE_BRACKET_RE.search(prepared):
            self.double_bracket = True
        prepared = _DOUBLE_BRACKET_RE.sub(lambda m: m.group(0)[0], prepared)
        prepared = self.hide_arithmetic(prepared)
        for m in _QUOTED_HEREDOC_RE.finditer(prepared):
            self.quoted_heredocs.add(m.group(2) or m.group(3) or m.group(4))
        prepared = _QUOTED_HEREDOC_RE.sub(
            lambda m: f"<<{m.group(1)}{m.group(2) or m.group(3) or m.group(4)}", prepared
        )
        try:
            trees = bashlex.parse(prepared)
        except Exception as exc:  # bashlex raises several types; all mean "cannot check"
            raise _Unparseable(f"{type(exc).__name__}: {exc}") from exc
        saved, self.src = self.src, prepared
        try:
            for tree in trees:
                self.node(tree, scope, _Flow())
        finally:
            self.src = saved

    def nested(
        self, text: str, scope: _Scope, what: str, unparseable: Verdict = Verdict.FORBID
    ) -> None:
        """Judge text run by `sh -c`, eval, trap …; unparseable nested text is refused too."""
        try:
            self.script(text, scope.child(deeper=True))
        except _Unparseable as exc:
            self.flag(
                unparseable,
                f"could not parse the commands run by {what} safely: {exc}; use a simpler form",
            )

    def hide_arithmetic(self, text: str) -> str:
        """`$((i * 2))` → a placeholder variable bashlex can parse; judged in `variable`.

        Expressions with substitutions, array subscripts or quotes are left alone, so the
        parser fails on them and the command is refused (fail-closed).
        """
        out: list[str] = []
        i = 0
        while (start := text.find("$((", i)) >= 0:
            depth, j = 2, start + 3
            while j < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
            expr = text[start + 3 : j - 2]
            if depth or text[j - 2 : j] != "))" or re.search(r"[`\[\]'\"]|\$\(", expr):
                out.append(text[i : start + 3])
                i = start + 3
                continue
            out.append(text[i:start] + f"${{{_ARITH}{len(self.arith)}}}")
            self.arith.append(expr)
            i = j
        out.append(text[i:])
        return "".join(out)

    def arithmetic(self, index: int, scope: _Scope) -> str | None:
        """Arithmetic re-evaluates variable values as expressions, and `a[$(cmd)]` inside such a
        value runs cmd: only variables with a known numeric value are fine."""
        expr = self.arith[index]
        for name in re.findall(r"[A-Za-z_]\w*", expr):
            value = scope.vars.get(name)
            if value is None or not re.fullmatch(r"-?\d+", value.strip()):
                self.flag(
                    Verdict.APPROVAL,
                    f"`$(({_short(expr, 40)}))` computes with `{name}`, a value only known at run "
                    "time (arithmetic on such values can run commands)",
                )
                return None
        return "0"

    def snippet(self, node: Any) -> str:
        pos = getattr(node, "pos", None)
        if not pos:
            return "?"
        text = re.sub(
            r"\$\{" + _ARITH + r"(\d+)\}",
            lambda m: f"$(({self.arith[int(m.group(1))]}))",
            self.src[pos[0] : pos[1]],
        )
        return _short(text)

    # ── tree walk ───────────────────────────────────────────────────────────────
    def node(self, node: Any, scope: _Scope, stdin: _Flow) -> _Flow:
        """Judge `node`; returns what it writes to stdout (for the next pipeline stage)."""
        kind = _kind(node)
        if kind == "list":
            return _merge(
                [self.node(p, scope, _Flow()) for p in node.parts if _kind(p) != "operator"]
            )
        if kind == "pipeline":
            flow = stdin
            stages = [p for p in node.parts if _kind(p) not in ("pipe", "reservedword")]
            for i, stage in enumerate(stages):
                flow = self.node(stage, scope.child() if len(stages) > 1 else scope, flow)
                if i < len(stages) - 1:
                    flow = _Flow(flow.taint, flow.text, None, True)
            return flow
        if kind == "command":
            return self.command(node, scope, stdin)
        if kind == "compound":
            return self.compound(node, scope, stdin)
        if kind == "function":
            self.function(node, scope)
            return _Flow()
        if kind in ("if", "while", "until"):
            for part in node.parts:
                if _kind(part) != "reservedword":
                    self.node(part, scope, _Flow())
            return _Flow()
        if kind == "for":
            self.for_loop(node, scope)
            return _Flow()
        if kind in ("reservedword", "operator", "pipe"):
            return _Flow()
        raise _Unparseable(f"unsupported shell construct ({kind or type(node).__name__})")

    def compound(self, node: Any, scope: _Scope, stdin: _Flow) -> _Flow:
        parts = node.list
        subshell = bool(parts) and _kind(parts[0]) == "reservedword" and parts[0].word == "("
        inner = scope.child() if subshell else scope
        out = _merge([self.node(p, inner, stdin) for p in parts if _kind(p) != "reservedword"])
        for redirect in getattr(node, "redirects", None) or []:
            self.redirect(redirect, scope, f"`{self.snippet(node)}`")
        return out

    def function(self, node: Any, scope: _Scope) -> None:
        words = [p for p in node.parts if _kind(p) == "word"]
        body = [p for p in node.parts if _kind(p) == "compound"]
        if not words or not body:
            raise _Unparseable("function definition without a name or body")
        name = words[0].word
        scope.functions.add(name)
        self.self_calls(name, body[0])
        self.node(body[0], scope.child(), _Flow())

    def self_calls(self, name: str, body: Any) -> None:
        """A function calling itself in a pipeline or in the background is a fork bomb."""
        for sub in _iter_nodes(body):
            kind = _kind(sub)
            if kind == "pipeline":
                calls = [p for p in sub.parts if _kind(p) == "command" and self._calls(p, name)]
                if calls:
                    self.flag(Verdict.FORBID, f"function `{name}` pipes into itself: a fork bomb")
                    return
            if kind == "list":
                parts = sub.parts
                for i, part in enumerate(parts[:-1]):
                    nxt = parts[i + 1]
                    if (
                        _kind(nxt) == "operator"
                        and nxt.op == "&"
                        and any(
                            _kind(n) == "command" and self._calls(n, name)
                            for n in _iter_nodes(part)
                        )
                    ):
                        self.flag(
                            Verdict.FORBID,
                            f"function `{name}` starts itself in the background: a fork bomb",
                        )
                        return
        if any(_kind(n) == "command" and self._calls(n, name) for n in _iter_nodes(body)):
            self.flag(Verdict.APPROVAL, f"function `{name}` calls itself (it may never stop)")

    @staticmethod
    def _calls(command: Any, name: str) -> bool:
        words = [p for p in command.parts if _kind(p) == "word"]
        return bool(words) and words[0].word == name

    def for_loop(self, node: Any, scope: _Scope) -> None:
        parts = node.parts
        var_node = next((p for p in parts if _kind(p) == "word"), None)
        if var_node is None:
            raise _Unparseable("for loop without a variable")
        var = var_node.word
        items: list[_Word] = []
        has_in = False
        body: list[Any] = []
        after_in = False
        for part in parts[parts.index(var_node) + 1 :]:
            kind = _kind(part)
            if kind == "reservedword" and part.word == "in":
                has_in = after_in = True
                continue
            if kind == "reservedword":
                after_in = False
                continue
            if after_in and kind == "word":
                items.extend(self.words_of(part, scope))
            elif kind != "word":
                body.append(part)
        values: list[str | None]
        if not has_in or len(items) > MAX_LOOP_ITEMS or not items:
            values = [None]
        else:
            values = [w.value for w in items]
        for value in values:
            inner = scope.child()
            inner.vars[var] = value
            for part in body:
                self.node(part, inner, _Flow())

    # ── words ───────────────────────────────────────────────────────────────────
    def word(self, node: Any, scope: _Scope) -> _Word:
        """Resolve a word node; substitutions inside it are judged as commands too."""
        raw = node.word
        value: str | None = raw
        for part in sorted(node.parts or [], key=lambda p: -p.pos[0]):
            kind = _kind(part)
            text = self.src[part.pos[0] : part.pos[1]]
            if kind in ("commandsubstitution", "processsubstitution"):
                self.node(part.command, scope.child(), _Flow())
                folded = self.fold(part) if kind == "commandsubstitution" else None
                value = None if folded is None or value is None else value.replace(text, folded, 1)
            elif kind == "parameter":
                param = getattr(part, "value", "") or ""
                if param.startswith("!") and re.fullmatch(r"![A-Za-z_]\w*", param):
                    target = self.variable(param[1:], scope)
                    if target is None or not re.fullmatch(r"[A-Za-z_]\w*", target):
                        self.flag(
                            Verdict.APPROVAL,
                            f"`{_short(text)}` expands the variable named by a value only known "
                            "at run time (a name like `a[$(cmd)]` runs cmd)",
                        )
                if re.search(r"@P$", param):
                    self.flag(
                        Verdict.APPROVAL,
                        f"`{_short(text)}` expands a prompt string, which runs the commands "
                        "inside the value",
                    )
                if "$(" in param or "`" in param:
                    for inner in _embedded_commands(param):
                        self.nested(inner, scope, f"`{_short(text)}`")
                known = self.variable(param, scope)
                value = None if known is None or value is None else value.replace(text, known, 1)
            elif kind == "tilde":
                if value is not None and value.startswith(part.value):
                    value = os.path.expanduser(part.value) + value[len(part.value) :]
        return _Word(raw, value, node)

    def words_of(self, node: Any, scope: _Scope) -> list[_Word]:
        """A word after expansion; an expanded value may split into several words."""
        word = self.word(node, scope)
        expanded = any(_kind(p) in ("parameter", "commandsubstitution") for p in node.parts or [])
        if expanded and word.value is not None and len(word.value.split()) > 1:
            return [_Word(piece, piece, node) for piece in word.value.split()]
        return [word]

    def variable(self, name: str, scope: _Scope) -> str | None:
        if name.startswith(_ARITH) and name[len(_ARITH) :].isdigit():
            return self.arithmetic(int(name[len(_ARITH) :]), scope)
        if self.ifs_changed:
            return None
        if name == "HOME":
            return self.home
        if name == "PWD":
            return scope.cwd
        return scope.vars.get(name)

    def fold(self, sub: Any) -> str | None:
        """`$(echo rm)` is just "rm": fold it so the command behind it is judged by name."""
        command = sub.command
        if _kind(command) != "command":
            return None
        words = [p for p in command.parts if _kind(p) == "word"]
        if len(words) != len(command.parts) or any(w.parts for w in words) or not words:
            return None
        name, args = words[0].word, [w.word for w in words[1:]]
        if name == "echo" and not any(a.startswith("-") for a in args):
            return " ".join(args)
        if name == "printf" and len(args) == 1 and not re.search(r"[%\\]", args[0]):
            return args[0]
        return None

    # ── paths ───────────────────────────────────────────────────────────────────
    def path(self, text: str, scope: _Scope) -> _Path:
        value = os.path.expanduser(text) if text.startswith("~") else text
        glob = False
        if any(c in _GLOB_CHARS for c in value):
            glob = True
            kept = []
            for piece in value.split("/"):
                if any(c in _GLOB_CHARS for c in piece):
                    break
                kept.append(piece)
            value = "/".join(kept) or ("/" if value.startswith("/") else ".")
        if not value.startswith("/"):
            if scope.cwd is None:
                return _Path(text, None, None, glob)
            value = os.path.join(scope.cwd, value)
        lexical = _norm(value)
        return _Path(text, lexical, os.path.realpath(lexical), glob)

    def inside(self, p: _Path) -> bool:
        return p.real is not None and _under(p.real, self.root)

    def is_protected(self, p: _Path) -> bool:
        return any(x is not None and x in self.protected for x in (p.lexical, p.real))

    def is_device(self, p: _Path) -> bool:
        return any(x is not None and BLOCK_DEVICE_RE.match(x) for x in (p.lexical, p.real))

    def check_credentials(self, word: _Word, scope: _Scope, where: str) -> None:
        """Refuse a word naming credentials, also through globs, `..`, symlinks and variables."""
        texts = [word.raw]
        concrete: list[str] = []  # paths to test against the dotenv rule
        if word.value is not None:
            texts.append(word.value)
            value = word.value.partition("=")[2] if word.value.startswith("-") else word.value
            if value:
                p = self.path(value, scope)
                if p.glob:
                    matches = self.expand_glob(value, scope)
                    texts += matches + self.glob_reaches_credentials(value, scope)
                    concrete += matches
                    if p.lexical is not None and any(
                        _under(x, d) for d in self.private for x in (p.lexical, p.real or "")
                    ):
                        concrete.append(os.path.join(p.lexical, "*"))  # what the glob reaches
                elif p.lexical is not None:
                    texts += [x for x in (p.lexical, p.real) if x]
                    concrete.append(p.lexical)
                elif self.policy.is_env_file(os.path.basename(value.rstrip("/"))):
                    self.flag(
                        Verdict.APPROVAL,
                        f"{where} uses `{value}` in a folder only known at run time",
                    )
        if word.value is None:
            # `/proc/$PPID/envi''ron`: judge the shape too, quotes removed
            shape = re.sub(r"[\'\"\\]", "", word.raw)
            texts.append(shape)
            base = os.path.basename(shape.rstrip("/"))
            if "$" not in base and "`" not in base and self.policy.is_env_file(base):
                self.flag(
                    Verdict.APPROVAL,
                    f"{where} uses `{base}` in a folder only known at run time",
                )
            if re.search(r"(?:^|[\s=:])/proc\b", shape):
                self.flag(
                    Verdict.APPROVAL,
                    f"{where} names a /proc path only known at run time (another process's "
                    "files and environment are there)",
                )
        for text in texts:
            for cred in self.policy.credentials:
                if cred.regex.search(text):
                    self.flag(Verdict.FORBID, f"{where} touches credentials ({cred.what})")
                    return
        for path in concrete:
            real = os.path.realpath(path)
            if self.reads_private(path, real):
                self.flag(
                    Verdict.FORBID,
                    f"{where} uses Steward's own data dir ({path}): its approvals, access "
                    "list and memory are not the agent's to read or change",
                )
                return
            names = (os.path.basename(path), os.path.basename(real))
            if any(self.policy.is_env_file(n) for n in names) and not _under(real, self.root):
                self.flag(
                    Verdict.FORBID,
                    f"{where} touches `{path}`, a secrets file outside the workspace",
                )
                return

    def expand_glob(self, value: str, scope: _Scope, cap: int = MAX_GLOB_MATCHES) -> list[str]:
        """What a glob matches right now (bash would expand it the same way), capped."""
        pattern = os.path.expanduser(value)
        if not pattern.startswith("/"):
            if scope.cwd is None:
                return []
            pattern = os.path.join(scope.cwd, pattern)
        found: list[str] = []
        for alternative in _expand_braces(pattern):
            found.extend(itertools.islice(glob.iglob(alternative), cap))
            if len(found) >= cap:
                break
        return found[:cap]

    def glob_reaches_credentials(self, value: str, scope: _Scope) -> list[str]:
        """Credential paths a glob could match even if they do not exist on this machine."""
        pattern = os.path.expanduser(value)
        if not pattern.startswith("/"):
            if scope.cwd is None:
                return []
            pattern = os.path.join(scope.cwd, pattern)
        hits = []
        for alternative in _expand_braces(_norm(pattern)):
            for example in self.policy.credential_examples:
                concrete = (
                    example.replace("~", self.home, 1) if example.startswith("~") else example
                )
                if _glob_matches(alternative, concrete):
                    hits.append(concrete)
        return hits

    def holds_credentials(self, p: _Path) -> bool:
        """Is `p` the home folder, a folder above it, /etc, or a folder outside the workspace
        holding Steward's data dir (reading all of it reads secrets)?"""
        real = p.real or p.lexical
        if real is None:
            return False
        if any(_under(d, real) for d in self.private) and not _under(real, self.root):
            return True
        return real in ("/etc", "/root") or _under(self.home, real) or _under("/root", real)

    def reads_private(self, lexical: str, real: str) -> bool:
        """Is this path in Steward's data dir (the policy files there may be read)?"""
        if lexical in self.guarded or real in self.guarded:
            return False
        # Below it: the folder as a whole is judged by what is done to it (a search through
        # it needs approval, deleting or moving it takes the policy file along).
        return any(_under(x, d) and x != d for d in self.private for x in (lexical, real))

    def policy_file(self, p: _Path, *, holding: bool = False) -> bool:
        """Is `p` one of the guardian's own policy files (or, `holding`, a folder above one)?"""
        for x in (p.lexical, p.real):
            if x is None or p.glob:
                continue
            if any(x == g or (holding and _under(g, x)) for g in self.guarded):
                return True
        return False

    def deletes_policy_file(self, value: str, p: _Path, scope: _Scope, *, recursive: bool) -> bool:
        """Would deleting `value` (a path or a glob) delete a policy file?"""
        if not p.glob:
            return self.policy_file(p, holding=recursive)
        pattern = os.path.expanduser(value)
        if not pattern.startswith("/"):
            if scope.cwd is None:
                return False
            pattern = os.path.join(scope.cwd, pattern)
        for guarded in self.guarded:
            reached = [guarded]
            if recursive:
                parent = os.path.dirname(guarded)
                while parent not in ("/", ""):
                    reached.append(parent)
                    parent = os.path.dirname(parent)
            for alternative in _expand_braces(_norm(pattern)):
                if any(_glob_matches(alternative, r) for r in reached):
                    return True
        return False

    def delete_count(self, value: str, p: _Path, scope: _Scope, recursive: bool, cap: int) -> int:
        """How many files deleting `value` removes, counted up to `cap` (cheap: stops there).

        A path counts one; a glob counts its matches; with -r a folder counts the files in it.
        """
        if not p.glob and p.real is None:
            return 1
        targets = self.expand_glob(value, scope, cap) if p.glob else [p.real or value]
        count = 0
        for target in targets:
            if count >= cap:
                break
            if not recursive or os.path.islink(target) or not os.path.isdir(target):
                count += 1
                continue
            count += max(1, _count_files(target, cap - count))
        return count

    def check_write(self, word: _Word, scope: _Scope, where: str, verb: str = "writes") -> None:
        """Writing to `word`: a disk device is refused, outside the workspace needs approval."""
        if word.value is None:
            self.flag(
                Verdict.APPROVAL,
                f"{where} {verb} `{word.raw}`, a path only known at run time",
            )
            return
        value = word.value
        if value in HARMLESS_DEVICES or HARMLESS_DEVICE_RE.match(value) or value == "-":
            return
        p = self.path(value, scope)
        if self.is_device(p):
            self.flag(Verdict.FORBID, f"{where} writes to the disk device {value}")
        elif any(x and KERNEL_FILE_RE.match(x) for x in (p.lexical, p.real)):
            self.flag(Verdict.FORBID, f"{where} writes to the kernel interface {value}")
        elif self.policy_file(p):
            self.flag(
                Verdict.FORBID,
                f"{where} {verb} `{value}`, the guardian's policy file; the agent may not "
                "change its own rules",
            )
        elif p.real is None:
            self.flag(
                Verdict.APPROVAL,
                f"{where} {verb} `{value}` after changing to a folder only known at run time",
            )
        elif not self.inside(p):
            self.flag(
                Verdict.APPROVAL,
                f"{where} {verb} outside the workspace ({p.lexical})",
                (f"write:{p.real}",),
            )
        elif verb != "uses" and (_git_runs_it(p.lexical) or _git_runs_it(p.real)):
            self.flag(
                Verdict.APPROVAL,
                f"{where} {verb} `{value}`: git's config and hooks decide what programs git "
                "runs later",
            )

    # ── redirections ────────────────────────────────────────────────────────────
    def redirect(self, node: Any, scope: _Scope, where: str) -> _Flow | None:
        """Judge one redirection; returns the stdin it provides, if any."""
        rtype = node.type
        target = node.output
        if rtype in ("<<", "<<-"):
            body = getattr(getattr(node, "heredoc", None), "value", "") or ""
            delim = target.word if _kind(target) == "word" else ""
            lines = body.split("\n")
            if lines and lines[-1].strip() == delim:
                lines = lines[:-1]
            body = "\n".join(lines)
            if delim not in self.quoted_heredocs:
                for inner in _embedded_commands(body):
                    self.nested(inner, scope, "a here-document")
            return _Flow(None, body, None, True)
        if isinstance(target, int) or _kind(target) != "word":
            return None  # fd duplication such as 2>&1
        words = [self.word(target, scope)]
        word = words[0]
        if rtype == "<<<":
            taint = _taint_of(_subst_nodes(word))
            return _Flow(taint, word.value, None, True)
        self.check_credentials(word, scope, where)
        if rtype in ("<", "<&"):
            return _Flow(_taint_of(_subst_nodes(word)), None, word, True)
        if rtype == "<>" or ">" in rtype:
            self.check_write(word, scope, where)
        return None

    # ── simple commands ─────────────────────────────────────────────────────────
    def command(self, node: Any, scope: _Scope, stdin: _Flow) -> _Flow:
        where = f"`{self.snippet(node)}`"
        words: list[_Word] = []
        assignments: list[tuple[str, str | None]] = []
        redirects = []
        for part in node.parts:
            kind = _kind(part)
            if kind == "assignment":
                name, _, _ = part.word.partition("=")
                value = self.word(part, scope).value
                assignments.append((name, None if value is None else value.partition("=")[2]))
            elif kind == "word":
                words.extend(self.words_of(part, scope))
            elif kind == "redirect":
                redirects.append(part)
        flow = stdin
        for redirect in redirects:
            provided = self.redirect(redirect, scope, where)
            if provided is not None:
                flow = provided
        for name, _value in assignments:
            if _risky_env(self.policy, name):
                self.flag(Verdict.APPROVAL, f"{where} sets {name}, which changes what programs run")
        if not words:
            for name, value in assignments:
                scope.vars[name] = value
            return _Flow()
        inner = scope.child() if assignments else scope
        for name, value in assignments:
            inner.vars[name] = value
        out = self.simple(words, inner, flow, where)
        # Files written here may be run next: remember what went into them.
        for redirect in redirects:
            if _kind(redirect.output) == "word" and ">" in redirect.type:
                target = self.word(redirect.output, scope)
                if out.taint == "network":
                    self._remember_download(target, scope)
                self.remember_written(target, scope, out.text if out.taint is None else None)
        return out

    def remember_written(self, word: _Word, scope: _Scope, text: str | None) -> None:
        if word.value is not None and word.value != "-":
            p = self.path(word.value, scope)
            if p.real is not None:
                self.written[p.real] = text

    def simple(self, words: list[_Word], scope: _Scope, stdin: _Flow, where: str) -> _Flow:
        """Judge a resolved simple command; returns what flows out of it."""
        first = words[0]
        if first.value is None or (
            first.value not in ("[", "[[") and any(c in _GLOB_CHARS for c in first.value)
        ):
            self.flag(
                Verdict.APPROVAL,
                f"{where}: the command name `{first.raw}` is only known at run time, so it "
                "cannot be checked",
            )
            return _Flow(_taint_of(_subst_nodes(first)) or stdin.taint)
        name = first.value
        if "/" in name:
            resolved = self.program_name(name, scope)
            if resolved is None:
                self.run_file(first, scope, where)
                return _Flow(stdin.taint)
            name = resolved
        cmd = _Cmd(name, words, where, scope, stdin)
        for word in cmd.args:
            self.check_credentials(word, scope, where)
            if word.value is None and _taint_of(_subst_nodes(word)) == "decoded":
                self.flag(Verdict.APPROVAL, f"{where} uses an argument hidden in decoded text")
        if name in scope.functions:
            return _Flow(stdin.taint)
        canonical = INTERPRETER_ALIASES.get(name, name)
        if re.fullmatch(r"python\d(\.\d+)?", canonical):
            canonical = "python"
        spec = self.spec("pip" if re.fullmatch(r"pip\d(\.\d+)?", canonical) else canonical)
        if spec is not None:
            cmd = _Cmd(name, [first, *self.normalise(cmd.args, spec, where)], where, scope, stdin)
            self.options(cmd.args, spec, scope, where)
        if canonical == "[" and self.double_bracket:
            self.bracket_arithmetic(cmd)
        if canonical in VARIABLE_SETTERS:
            for word in cmd.args:
                var = word.text.partition("=")[0]
                if _ENV_NAME_RE.match(var) and _risky_env(self.policy, var):
                    self.flag(
                        Verdict.APPROVAL, f"{where} sets {var}, which changes what programs run"
                    )
                    break
        if canonical in SUBSCRIPT_BUILTINS:
            for word in cmd.args:
                if word.value is not None and _SUBSCRIPT_CODE_RE.search(word.value):
                    self.flag(
                        Verdict.APPROVAL,
                        f"{where}: `{_short(word.value, 40)}` is an array subscript `{name}` "
                        "evaluates, and the command substitution in it runs",
                    )
        reason = self.policy.forbidden_reason(name, canonical)
        if reason:
            self.flag(Verdict.FORBID, f"{where} {reason}")
            return _Flow()
        # An approval entry asks first, and the command is still judged (its arguments may
        # make it worse: a forbidden credential path, a write to a disk).
        asks = self.policy.approval_reason(name, canonical)
        if asks:
            self.flag(Verdict.APPROVAL, f"{where} {asks}", _needs(asks))
        out = self.dispatch(cmd, canonical, asks is not None)
        if canonical in DECODERS:
            return _Flow("decoded")
        if canonical in DOWNLOADERS and out.taint is None:
            return _Flow("network")
        return out

    def dispatch(self, cmd: _Cmd, canonical: str, asked: bool = False) -> _Flow:
        """The rule table lookup for one command name (`asked`: approval already flagged)."""
        name, stdin, policy = cmd.name, cmd.stdin, self.policy
        handler = _HANDLERS.get(canonical)
        if handler is not None:
            return handler(self, cmd) or _Flow(stdin.taint)
        if canonical in INTERPRETERS:
            return self.interpreter(cmd, canonical)
        if canonical in WRAPPERS:
            return self.wrapper(cmd)
        if canonical in policy.subcommands or re.fullmatch(r"pip\d(\.\d+)?", canonical):
            return self.subcommand(cmd, "pip" if canonical.startswith("pip") else canonical)
        extra = _EXTRA_CHECKS.get(canonical)
        if extra is not None:
            extra(self, cmd)
        if canonical in policy.allow:
            return self.output_of(cmd)
        if canonical in policy.workspace_writers:
            self.writer(cmd)
            if canonical == "tee":  # passes its input on, and writes it to files
                for word in _positionals(cmd.args):
                    self.remember_written(word, cmd.scope, stdin.text)
                return _Flow(stdin.taint, stdin.text, None, stdin.present)
            return _Flow(stdin.taint)
        if asked:
            return _Flow()
        self.flag(Verdict.APPROVAL, f"`{name}` is not on the read-only allowlist")
        return _Flow(stdin.taint)

    def program_name(self, name: str, scope: _Scope) -> str | None:
        """The rule name for a program given by path, or None to judge it as a file to run.

        `/usr/bin/rm` is `rm`; so is a workspace symlink that leads to it, and a venv's
        `bin/python` linking to the system Python is `python`.
        """
        folder, base = os.path.split(name)
        if folder in SYSTEM_BIN_DIRS:
            return base
        p = self.path(name, scope)
        if p.real is None or self.inside(p):
            return None
        real_folder, real_base = os.path.split(p.real)
        if real_folder in SYSTEM_BIN_DIRS or re.fullmatch(
            r"python\d?(\.\d+)?|pypy3?|node|ruby|perl", real_base
        ):
            return real_base
        return None

    def spec(self, name: str) -> OptionSpec | None:
        """How `name` reads its options (OPTION_SPECS; `git-grep` for git's subcommands)
        joined with what they do (the policy's [options.<name>]); None when neither knows."""
        if name in self._specs:
            return self._specs[name]
        syntax = (
            GIT_SUBCOMMAND_SPECS.get(name[4:])
            if name.startswith("git-")
            else OPTION_SPECS.get(name)
        )
        risks = self.policy.options.get(name)
        result = syntax
        if risks is not None:
            # A program the engine cannot parse keeps its words as written.
            base = syntax or replace(_NO_OPTIONS, clusters=False, abbreviations=False)
            long = dict(base.long)
            for option in [*risks.runs, *risks.writes, *risks.configs]:
                if option.startswith("--"):
                    long.setdefault(option, "flag")
            result = replace(
                base,
                long=long,
                runs=dict(risks.runs),
                writes=frozenset(risks.writes),
                configs=frozenset(risks.configs),
            )
        self._specs[name] = result
        return result

    def normalise(self, words: list[_Word], spec: OptionSpec, where: str) -> list[_Word]:
        """`normalise_options`; a prefix that fits several options asks (fail-closed: which
        one the program takes is not known here, and a program we know less well than
        its author might take a risky one)."""

        def ambiguous(name: str, hits: list[str]) -> None:
            risky = [h for h in hits if h in spec.runs or h in spec.writes] or hits
            self.flag(
                Verdict.APPROVAL,
                f"{where}: `{name}` may stand for `{risky[0]}` ({len(hits)} options start so)",
            )

        return normalise_options(words, spec, ambiguous)

    def options(self, words: list[_Word], spec: OptionSpec, scope: _Scope, where: str) -> None:
        """Options (normalised) that run a program need approval; those that write are
        checked like a redirection of their value."""
        i = 0
        while i < len(words):
            text = words[i].text
            if text == "--":
                return
            if not text.startswith("-") or text == "-":
                if spec.stop_at_operand and not text.startswith("+"):
                    return
                i += 1
                continue
            key = text.partition("=")[0] if text.startswith("--") else text
            if not text.startswith("--") and len(text) > 2 and text[1] in spec.short_glued:
                key = text[:2]  # `-Ovim`: -O with its optional value glued
            reason = spec.runs.get(key)
            if reason is None and not spec.clusters:  # `-fplugin=x.so`, `-TTcmd`
                reason = next((r for k, r in spec.runs.items() if text.startswith(k)), None)
            if reason is not None:
                self.flag(Verdict.APPROVAL, f"{where}: `{key}` {reason}")
            if key in spec.writes or key in spec.configs:
                if "=" in text and text.startswith("--"):
                    val = text.partition("=")[2]
                    target: _Word | None = _Word(val, val if words[i].value is not None else None)
                elif spec.long.get(key) == "optional":
                    target = None  # `--debug` alone writes to its default name here
                else:
                    target = words[i + 1] if i + 1 < len(words) else None
                if target is not None and key in spec.writes:
                    self.check_write(target, scope, where)
                elif target is not None:
                    self.check_config(target, scope, where, key)
            i += 2 if spec.takes_value(key) and "=" not in text else 1

    def check_config(self, word: _Word, scope: _Scope, where: str, option: str) -> None:
        """A settings file from outside the workspace can load code the agent never showed."""
        inside = word.value is not None and self.inside(self.path(word.value, scope))
        if not inside:
            self.flag(
                Verdict.APPROVAL,
                f"{where}: `{option} {word.raw}` takes settings (which can load code) from "
                "outside the workspace",
            )

    def bracket_arithmetic(self, cmd: _Cmd) -> None:
        """In `[[ a -eq b ]]` both sides are arithmetic, and a value such as `x[$(cmd)]`
        runs cmd: only numbers, special parameters and known values are fine."""
        args = cmd.args
        for i, word in enumerate(args):
            if word.text not in ARITHMETIC_TESTS:
                continue
            for side in (args[i - 1] if i else None, args[i + 1] if i + 1 < len(args) else None):
                if side is None or side.value is not None or _SPECIAL_PARAM_RE.match(side.raw):
                    continue
                self.flag(
                    Verdict.APPROVAL,
                    f"{cmd.snippet}: `[[ … {word.text} … ]]` computes with `{side.raw}`, a value "
                    "only known at run time (arithmetic on such values can run commands)",
                )
                return

    def output_of(self, cmd: _Cmd) -> _Flow:
        """What a read-only command passes on: literal text for echo/printf, taint through."""
        values = [w.value for w in cmd.args]
        if cmd.name == "echo" and None not in values:
            texts = [v for v in values if v is not None]
            if texts and texts[0] in ("-e", "-en", "-ne"):
                if any(re.search(r"\\(?:x|0|u|U)", t) for t in texts):
                    return _Flow("decoded")  # escapes that can spell out any command
                texts = [t.replace("\\n", "\n").replace("\\t", "\t") for t in texts]
            texts = [t for t in texts if t not in ("-n", "-e", "-E", "-en", "-ne")]
            return _Flow(None, " ".join(texts), None, True)
        if cmd.name == "printf" and None not in values and values:
            fmt = values[0] or ""
            if re.search(r"\\(?:x|[0-7]|u|U)", fmt):
                return _Flow("decoded")
            if "%" not in fmt:
                return _Flow(None, fmt.replace("\\n", "\n"), None, True)
        if cmd.name == "cat" and not _positionals(cmd.args):
            return _Flow(cmd.stdin.taint, cmd.stdin.text, None, cmd.stdin.present)
        return _Flow(cmd.stdin.taint)

    def writer(self, cmd: _Cmd) -> None:
        """Every path-like argument (and option value) must stay in the workspace."""
        if cmd.name == "mv":  # moving a folder away takes the policy file in it along
            operands = _operands(cmd.args, OPTION_SPECS["mv"])
            into = any(w.text in ("-t", "--target-directory") for w in cmd.args)
            for word in operands if into else operands[:-1]:
                if word.value is not None and self.policy_file(
                    self.path(word.value, cmd.scope), holding=True
                ):
                    self.flag(
                        Verdict.FORBID,
                        f"{cmd.snippet} moves the guardian's policy file away; the agent may "
                        "not change its own rules",
                    )
        for word in cmd.args:
            text = word.text
            if text.startswith("-"):
                if "=" in text and word.value is not None:
                    self.check_write(_Word(text, text.split("=", 1)[1]), cmd.scope, cmd.snippet)
                continue
            if cmd.name in ("rsync", "scp") and re.match(r"^[^/]*:|^rsync://", text):
                self.flag(
                    Verdict.APPROVAL, f"{cmd.snippet} copies to or from a remote host", ("network",)
                )
                continue
            self.check_write(word, cmd.scope, cmd.snippet, "changes")

    def run_file(self, word: _Word, scope: _Scope, where: str, *, shell: bool = False) -> None:
        """Running a program or script by path: fine inside the workspace.

        A shell script in the workspace is read and judged line by line, so writing
        `rm -rf /` into a file first and running it gets the same verdict as typing it.
        """
        if any(_kind(p) == "processsubstitution" for p in _subst_nodes(word)):
            taint = _taint_of(_subst_nodes(word))
            if taint == "network":
                self.flag(Verdict.FORBID, f"{where} runs code downloaded from the network")
            elif taint == "decoded":
                self.flag(Verdict.FORBID, f"{where} runs hidden (decoded) code")
            else:
                self.flag(Verdict.APPROVAL, f"{where} runs code produced at run time")
            return
        if word.value is None:
            self.flag(Verdict.APPROVAL, f"{where} runs `{word.raw}`, only known at run time")
            return
        p = self.path(word.value, scope)
        if p.real is not None and p.real in self.downloaded:
            self.flag(Verdict.FORBID, f"{where} runs a file just downloaded from the network")
        elif not self.inside(p) or p.real is None:
            self.flag(Verdict.APPROVAL, f"{where} runs a program outside the workspace")
        elif p.real in self.written:
            text = self.written[p.real]
            if text is None or not (shell or text.startswith("#!")):
                self.flag(Verdict.APPROVAL, f"{where} runs a file this same command writes")
            else:
                self.nested(text, scope, f"`{word.value}`", Verdict.APPROVAL)
        else:
            self.script_file(p.real, scope, where, shell=shell)

    def script_file(self, real: str, scope: _Scope, where: str, *, shell: bool) -> None:
        """Judge a shell script from the workspace by its content."""
        try:
            if not os.path.exists(real):
                if shell or real.endswith(".sh"):
                    self.flag(Verdict.APPROVAL, f"{where} runs a file that does not exist yet")
                return
            if not os.path.isfile(real):
                return
            with open(real, "rb") as fh:
                head = fh.read(MAX_SCRIPT_BYTES + 1)
        except OSError:
            return
        first = head.split(b"\n", 1)[0]
        is_shell = (
            shell
            or (
                first.startswith(b"#!") and re.search(rb"\b(?:ba|z|da|k|a)?sh\b", first) is not None
            )
            or (real.endswith(".sh") and not first.startswith(b"#!"))
        )
        if not is_shell or b"\x00" in head[:8192]:
            return
        if len(head) > MAX_SCRIPT_BYTES:
            self.flag(Verdict.APPROVAL, f"{where} runs a shell script too long to check")
            return
        name = os.path.relpath(real, self.root)
        before = len(self.findings)
        self.nested(head.decode("utf-8", "replace"), scope, f"`{name}`", Verdict.APPROVAL)
        for i in range(before, len(self.findings)):
            finding = self.findings[i]
            self.findings[i] = Decision(finding.verdict, f"{name}: {finding.reason}", finding.needs)

    def stdin_code(self, cmd: _Cmd, *, shell: bool) -> None:
        """A shell or interpreter reading its program from stdin."""
        flow, where = cmd.stdin, cmd.snippet
        if flow.taint == "network":
            self.flag(Verdict.FORBID, f"{where} runs code downloaded from the network")
        elif flow.taint == "decoded":
            self.flag(Verdict.FORBID, f"{where} runs hidden (decoded) code")
        elif flow.path is not None:
            self.run_file(flow.path, cmd.scope, where, shell=shell)
        elif flow.text is not None and shell:
            self.nested(flow.text, cmd.scope, where)
        elif flow.text is not None:
            self.flag(Verdict.APPROVAL, f"{where} runs inline code that cannot be checked")
        elif flow.present:
            self.flag(Verdict.APPROVAL, f"{where} runs commands read from a pipe")

    def _remember_download(self, word: _Word, scope: _Scope) -> None:
        if word.value and word.value != "-":
            p = self.path(word.value, scope)
            if p.real:
                self.downloaded.add(p.real)

    # ── handlers for families of commands ───────────────────────────────────────
    def interpreter(self, cmd: _Cmd, lang: str) -> _Flow:
        code_opts, value_opts = INTERPRETERS[lang]
        args = cmd.args
        i = 0
        while i < len(args):
            text = args[i].text
            if text in code_opts or (
                lang in ("perl", "ruby") and re.fullmatch(r"-[a-zA-Z]*[eE]", text)
            ):
                self.flag(
                    Verdict.APPROVAL, f"{cmd.snippet} runs inline code that cannot be checked"
                )
                return _Flow()
            if lang == "python" and text == "-m" and i + 1 < len(args):
                module = args[i + 1].text
                if module == "pip":
                    pip = self.spec("pip") or _NO_OPTIONS
                    pip_args = self.normalise(args[i + 2 :], pip, cmd.snippet)
                    self.options(pip_args, pip, cmd.scope, cmd.snippet)
                    return self.subcommand(
                        _Cmd("pip", [args[i + 1], *pip_args], cmd.snippet, cmd.scope, cmd.stdin),
                        "pip",
                    )
                if module in ("base64", "uu", "binascii"):
                    return _Flow("decoded")
                if module == "json.tool":  # `python -m json.tool in.json out.json`
                    written = _operands(args[i + 2 :], _NO_OPTIONS)[1:2]
                    for target in written:
                        self.check_write(target, cmd.scope, cmd.snippet)
                elif module == "venv":
                    venv_dirs = _operands(args[i + 2 :], _NO_OPTIONS)
                    for target in venv_dirs or [_Word(".", ".")]:
                        self.check_write(target, cmd.scope, cmd.snippet)
                elif module in PYTHON_MODULES_OK and (
                    self.spec(module) is not None or module in _EXTRA_CHECKS
                ):  # `python -m pytest -c /tmp/x.ini` is judged as `pytest -c /tmp/x.ini`
                    return self.simple(
                        [_Word(module, module), *args[i + 2 :]], cmd.scope, cmd.stdin, cmd.snippet
                    )
                elif module not in PYTHON_MODULES_OK:
                    self.flag(
                        Verdict.APPROVAL,
                        f"{cmd.snippet} runs the module `{module}`, whose options are not checked",
                    )
                return _Flow()
            if text in value_opts:
                i += 2
                continue
            if text == "-" or not text.startswith("-"):
                break
            i += 1
        if i >= len(args) or args[i].text == "-":
            self.stdin_code(cmd, shell=False)
        else:
            self.run_file(args[i], cmd.scope, cmd.snippet)
        return _Flow()

    def wrapper(self, cmd: _Cmd) -> _Flow:
        short, long, reason = WRAPPERS[cmd.name]
        if reason:
            self.flag(Verdict.APPROVAL, f"{cmd.snippet} {reason}")
        rest = _skip_options(cmd.args, short, long)
        if not rest:
            if cmd.name in ("sudo", "doas"):
                self.flag(Verdict.APPROVAL, f"{cmd.snippet} opens a root shell")
            return _Flow()
        return self.simple(rest, cmd.scope, cmd.stdin, cmd.snippet)

    def subcommand(self, cmd: _Cmd, tool: str) -> _Flow:
        rules = self.policy.subcommands.get(tool)
        if rules is None:  # `pip3` with no [subcommands.pip] table
            self.flag(Verdict.APPROVAL, f"`{cmd.name}` is not on the read-only allowlist")
            return _Flow(cmd.stdin.taint)
        allowed = rules.allow
        spec = OPTION_SPECS.get(tool)
        positionals = (
            _operands(cmd.args, spec)
            if spec is not None
            else [w for w in cmd.args if not w.text.startswith("-") or w.text in allowed]
        )
        sub = positionals[0].text if positionals else ""
        if sub in rules.forbid:
            self.flag(Verdict.FORBID, f"{cmd.snippet} {rules.forbid[sub]}")
            return _Flow()
        if sub in rules.approval:
            reason = rules.approval[sub]
            self.flag(Verdict.APPROVAL, f"{cmd.snippet} {reason}", _needs(reason))
            return _Flow(cmd.stdin.taint)
        if tool == "uv" and sub == "pip":
            rest = cmd.args[cmd.args.index(positionals[0]) + 1 :]
            return self.subcommand(
                _Cmd("pip", [cmd.words[0], *rest], cmd.snippet, cmd.scope, cmd.stdin), "pip"
            )
        if (tool, sub) in RUNNER_SUBCOMMANDS:
            rest = cmd.args[cmd.args.index(positionals[0]) + 1 :]
            rest = _skip_options(rest, frozenset(), _RUNNER_VALUE_OPTIONS)
            if any(w.text in ("--with", "--with-requirements") for w in cmd.args):
                self.flag(Verdict.APPROVAL, f"{cmd.snippet} {_INSTALL}", ("network",))
            if rest:
                return self.simple(rest, cmd.scope, cmd.stdin, cmd.snippet)
            return _Flow()
        if sub not in allowed:
            shown = f"{cmd.name} {sub}".strip()
            self.flag(Verdict.APPROVAL, f"`{shown}` is not on the read-only allowlist")
        return _Flow(cmd.stdin.taint)


def _count_files(folder: str, cap: int) -> int:
    """Files (not folders) below `folder`, without following links; stops at `cap`."""
    count = 0
    stack = [folder]
    while stack and count < cap:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    else:
                        count += 1
                        if count >= cap:
                            break
        except OSError:
            continue
    return count


def _skip_options(words: list[_Word], short: frozenset[str], long: frozenset[str]) -> list[_Word]:
    """The words after a wrapper's own options (and NAME=value pairs for env)."""
    i = 0
    while i < len(words):
        text = words[i].text
        if text == "--":
            return words[i + 1 :]
        if text.startswith("--"):
            i += 1 if "=" in text or text not in long else 2
            continue
        if text.startswith("-") and len(text) > 1 and not text[1:].isdigit():
            flag = text[1]
            i += 2 if flag in short and len(text) == 2 else 1
            continue
        if text.startswith("-") and text[1:].isdigit():  # nice -10
            i += 1
            continue
        return words[i:]
    return []


def _short_flags(words: list[_Word]) -> set[str]:
    """Single-letter flags present in clusters like -rf (before `--`)."""
    flags: set[str] = set()
    for w in words:
        if w.text == "--":
            break
        if w.text.startswith("-") and not w.text.startswith("--"):
            flags.update(w.text[1:])
    return flags


def _positionals(words: list[_Word]) -> list[_Word]:
    out: list[_Word] = []
    rest = False
    for w in words:
        if not rest and w.text == "--":
            rest = True
        elif rest or not w.text.startswith("-") or w.text == "-":
            out.append(w)
    return out


def _merge(flows: list[_Flow]) -> _Flow:
    """The output of several commands in a row (`{ a; b; } | sh`): any taint, all text."""
    if not flows:
        return _Flow()
    taints = [f.taint for f in flows if f.taint]
    taint = "network" if "network" in taints else (taints[0] if taints else None)
    texts = [f.text for f in flows]
    text = None if None in texts else "\n".join(t for t in texts if t is not None)
    return _Flow(taint, text, None, any(f.present for f in flows))


_NO_SUBCOMMANDS = Subcommands(frozenset(), {}, {})
_NO_OPTIONS = OptionSpec()
WGET_VALUE_LONG = frozenset(k for k, v in OPTION_SPECS["wget"].long.items() if v == "value")
_RUNNER_VALUE_OPTIONS = frozenset(
    "--python --directory --project --with --with-requirements --env-file --group".split()
)


# ── command handlers (the rule table for commands that need their arguments read) ──


def _rm(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    flags = _short_flags(cmd.args)
    longs = {w.text for w in cmd.args if w.text.startswith("--")}
    recursive = bool(flags & {"r", "R"}) or "--recursive" in longs
    force = "f" in flags or "--force" in longs
    if "--no-preserve-root" in longs:
        a.flag(Verdict.FORBID, f"{cmd.snippet} disables rm's protection of / (--no-preserve-root)")
    limit = a.policy.max_delete_files
    count = 0  # files this rm deletes, counted up to limit + 1
    for target in _positionals(cmd.args):
        if target.value is not None:
            p = a.path(target.value, cmd.scope)
            if (recursive or force) and a.is_protected(p):
                shown = os.path.join(p.lexical or "", "*") if p.glob else p.lexical
                a.flag(Verdict.FORBID, f"{cmd.snippet} deletes {shown}, a system or home folder")
                continue
            if a.deletes_policy_file(target.value, p, cmd.scope, recursive=recursive):
                a.flag(
                    Verdict.FORBID,
                    f"{cmd.snippet} deletes the guardian's policy file; the agent may not "
                    "change its own rules",
                )
                continue
            if recursive and p.real == a.root:
                a.flag(Verdict.APPROVAL, f"{cmd.snippet} deletes the whole workspace")
                continue
            if count <= limit:
                count += a.delete_count(target.value, p, cmd.scope, recursive, limit + 1 - count)
        else:
            count += 1
        a.check_write(target, cmd.scope, cmd.snippet, "deletes")
    if count > limit:
        a.flag(
            Verdict.APPROVAL,
            f"{cmd.snippet} deletes more than {limit} files at once (max_delete_files)",
        )
    return None


def _grep(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    """Searching recursively through ~ or / reads ~/.ssh and friends on the way."""
    flags = _short_flags(cmd.args)
    longs = {w.text.split("=")[0] for w in cmd.args if w.text.startswith("--")}
    recursive = (
        cmd.name in ("rg", "ag", "ack")
        or bool(flags & {"r", "R"})
        or bool(longs & {"--recursive", "--dereference-recursive"})
    )
    if recursive:
        for word in _positionals(cmd.args):
            if word.value is not None:
                p = a.path(word.value, cmd.scope)
                if a.holds_credentials(p):
                    a.flag(
                        Verdict.APPROVAL,
                        f"{cmd.snippet} searches all of {p.lexical}, where credentials live",
                    )
                    break
    return _Flow(cmd.stdin.taint)


def _chmod(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    flags = _short_flags(cmd.args)
    recursive = "R" in flags or any(w.text == "--recursive" for w in cmd.args)
    for target in _positionals(cmd.args)[1:]:
        if recursive and target.value is not None:
            p = a.path(target.value, cmd.scope)
            if a.is_protected(p):
                a.flag(Verdict.FORBID, f"{cmd.snippet} changes a whole system folder ({p.lexical})")
                continue
        a.check_write(target, cmd.scope, cmd.snippet, "changes")
    return None


def _dd(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    for word in cmd.args:
        key, _, val = word.text.partition("=")
        if key == "of":
            a.check_write(
                _Word(val, val if word.value is not None else None), cmd.scope, cmd.snippet
            )
            continue
        elif key == "if" and word.value is not None and a.is_device(a.path(val, cmd.scope)):
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} reads a raw disk")
    return None


def _disk_tool(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    """fdisk, parted, mkswap, shred…: on a disk device they destroy it."""
    listing = any(w.text in ("-l", "--list", "print", "-d", "--dump") for w in cmd.args)
    for word in cmd.args:
        if word.value is not None and a.is_device(a.path(word.value, cmd.scope)) and not listing:
            a.flag(Verdict.FORBID, f"{cmd.snippet} rewrites the disk device {word.value}")
            return None
    if cmd.name == "shred":
        a.writer(cmd)
    else:
        a.flag(Verdict.APPROVAL, f"`{cmd.name}` is not on the read-only allowlist")
    return None


def _find(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    args = cmd.args
    i = 0
    while i < len(args) and args[i].text in ("-H", "-L", "-P", "-D", "-O"):
        i += 2 if args[i].text == "-D" else 1
    starts: list[_Word] = []
    while i < len(args) and not args[i].text.startswith(("-", "(", "!", ")")):
        starts.append(args[i])
        i += 1
    starts = starts or [_Word(".", ".")]
    while i < len(args):
        text = args[i].text
        if text == "-delete":
            for start in starts:
                p = a.path(start.value, cmd.scope) if start.value is not None else None
                if p is not None and a.is_protected(p):
                    a.flag(Verdict.FORBID, f"{cmd.snippet} deletes files across {p.lexical}")
                elif p is not None and a.policy_file(p, holding=True):
                    a.flag(
                        Verdict.FORBID,
                        f"{cmd.snippet} deletes the guardian's policy file; the agent may not "
                        "change its own rules",
                    )
                else:
                    a.flag(
                        Verdict.APPROVAL,
                        f"{cmd.snippet} deletes every file it matches (find -delete)",
                    )
        elif text in ("-exec", "-execdir", "-ok", "-okdir"):
            j = i + 1
            while j < len(args) and args[j].text not in (";", "+"):
                j += 1
            inner = args[i + 1 : j]
            for start in starts:
                if start.value is not None and a.holds_credentials(a.path(start.value, cmd.scope)):
                    a.flag(
                        Verdict.APPROVAL,
                        f"{cmd.snippet} runs a command on every file under {start.value}, "
                        "where credentials live",
                    )
            if inner:
                for start in starts:
                    words = [start if w.text == "{}" else w for w in inner]
                    a.simple(words, cmd.scope, _Flow(), cmd.snippet)
                if inner[0].text in DESTRUCTIVE:
                    a.flag(
                        Verdict.APPROVAL,
                        f"{cmd.snippet} runs `{inner[0].text}` on every file it matches",
                    )
            i = j
        elif text in ("-fprint", "-fprint0", "-fprintf", "-fls") and i + 1 < len(args):
            a.check_write(args[i + 1], cmd.scope, cmd.snippet)
        i += 1
    return None


def _built_at_run_time(a: _Analysis, cmd: _Cmd) -> None:
    """A URL, header or option built from `$(…)` or an unknown variable can carry any
    file's text out in a plain GET (`?k=$(cat .env)`, `-H "X: $(…)"`)."""
    for word in cmd.args:
        if word.value is None:
            a.flag(
                Verdict.APPROVAL,
                f"{cmd.snippet} sends `{_short(word.raw, 40)}`, text only known at run time, "
                "to the network",
            )
            return


def _curl(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    _built_at_run_time(a, cmd)
    for opt, val in _parse_options(cmd.args, CURL_VALUE_SHORT, CURL_VALUE_LONG):
        if opt in CURL_UPLOAD_OPTIONS:
            a.flag(
                Verdict.APPROVAL, f"{cmd.snippet} sends data to the network ({opt})", ("network",)
            )
        elif (
            opt in ("-X", "--request")
            and val is not None
            and val.text.upper() not in ("GET", "HEAD")
        ):
            a.flag(
                Verdict.APPROVAL, f"{cmd.snippet} sends a {val.text.upper()} request", ("network",)
            )
        elif opt in ("-o", "--output") and val is not None:
            a.check_write(val, cmd.scope, cmd.snippet)
            a._remember_download(val, cmd.scope)
        elif opt in ("-O", "--remote-name", "--remote-name-all"):
            a.check_write(_Word(".", "."), cmd.scope, cmd.snippet)
            for url in _positionals(cmd.args):
                name = os.path.basename(urlsplit(url.text).path)
                if name:
                    a._remember_download(_Word(name, name), cmd.scope)
        elif opt == "--output-dir" and val is not None:
            a.check_write(val, cmd.scope, cmd.snippet)
        elif opt in ("-K", "--config"):
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} reads its options from a file")
        elif opt in ("-H", "--header") and val is not None and val.text.startswith("@"):
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} sends headers read from a file")
        elif opt == "--variable":
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} reads a file or variable it can send on")
    for url in _positionals(cmd.args):
        scheme = urlsplit(url.text).scheme.lower() if "://" in url.text else ""
        if scheme and scheme not in ("http", "https", "ftp", "ftps", "file"):
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} uses the {scheme}:// protocol")
        if scheme == "file":  # file:///…/steward.toml is a read like cat's
            local = urlsplit(url.text).path
            a.check_credentials(
                _Word(local, local if url.value is not None else None), cmd.scope, cmd.snippet
            )
    return _Flow("network")


def _wget(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    _built_at_run_time(a, cmd)
    to_stdout = False
    named = False
    for opt, val in _parse_options(cmd.args, WGET_VALUE_SHORT, WGET_VALUE_LONG):
        key = opt.split("=", 1)[0]
        if key in WGET_UPLOAD_OPTIONS:
            a.flag(
                Verdict.APPROVAL, f"{cmd.snippet} sends data to the network ({key})", ("network",)
            )
        elif key == "--method":
            method = opt.partition("=")[2] or (val.text if val else "")
            if method.upper() not in ("GET", "HEAD"):
                a.flag(
                    Verdict.APPROVAL,
                    f"{cmd.snippet} sends a {method.upper()} request",
                    ("network",),
                )
        elif key in ("-O", "--output-document"):
            target = val if val is not None else _Word(opt.partition("=")[2], opt.partition("=")[2])
            named = True
            if target.text == "-":
                to_stdout = True
            else:
                a.check_write(target, cmd.scope, cmd.snippet)
                a._remember_download(target, cmd.scope)
        elif key in ("-P", "--directory-prefix"):
            target = val if val is not None else _Word(opt.partition("=")[2], opt.partition("=")[2])
            a.check_write(target, cmd.scope, cmd.snippet)
            named = True
        elif key in ("-o", "-a", "--output-file", "--append-output") and val is not None:
            a.check_write(val, cmd.scope, cmd.snippet)
    if not named:
        a.check_write(_Word(".", "."), cmd.scope, cmd.snippet)
        for url in _positionals(cmd.args):
            name = os.path.basename(urlsplit(url.text).path)
            if name:
                a._remember_download(_Word(name, name), cmd.scope)
    return _Flow("network") if to_stdout or named else _Flow()


def _parse_options(
    words: list[_Word], short_values: frozenset[str], long_values: frozenset[str]
) -> Iterator[tuple[str, _Word | None]]:
    """(option, value) pairs: -XPOST, -X POST, --request=POST, --request POST, -sSLo file."""
    i = 0
    while i < len(words):
        text = words[i].text
        if text == "--":
            return
        if text.startswith("--"):
            opt, eq, val = text.partition("=")
            if eq:
                yield opt, _Word(val, val)
            elif opt in long_values and i + 1 < len(words):
                yield opt, words[i + 1]
                i += 1
            else:
                yield opt, None
        elif text.startswith("-") and len(text) > 1:
            for k, ch in enumerate(text[1:], start=1):
                if ch in short_values:
                    rest = text[k + 1 :]
                    if rest:
                        yield f"-{ch}", _Word(rest, rest)
                    elif i + 1 < len(words):
                        yield f"-{ch}", words[i + 1]
                        i += 1
                    else:
                        yield f"-{ch}", None
                    break
                yield f"-{ch}", None
        i += 1


def _git(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    args = cmd.args
    i = 0
    while i < len(args) and args[i].text.startswith("-"):
        text = args[i].text
        if text in ("-c", "--config-env") or text.startswith("--exec-path"):
            a.flag(
                Verdict.APPROVAL,
                f"{cmd.snippet} sets git config for this run (it can run programs)",
            )
        if text in ("-C", "--git-dir", "--work-tree") or text.startswith(
            ("--git-dir=", "--work-tree=")
        ):
            target = (
                args[i + 1]
                if "=" not in text and i + 1 < len(args)
                else _Word(text.split("=", 1)[-1], text.split("=", 1)[-1])
            )
            if text == "-C":
                if target.value is None:
                    a.flag(
                        Verdict.APPROVAL, f"{cmd.snippet} works in a folder only known at run time"
                    )
                else:
                    p = a.path(target.value, cmd.scope)
                    if not a.inside(p):
                        a.flag(
                            Verdict.APPROVAL,
                            f"{cmd.snippet} works on a repository outside the workspace",
                        )
            else:
                a.check_write(target, cmd.scope, cmd.snippet, "uses")
        i += 2 if OPTION_SPECS["git"].takes_value(text) else 1
    if i >= len(args):
        return None
    sub, rest = args[i].text, args[i + 1 :]
    sub_spec = a.spec(f"git-{sub}")
    if GIT_SUBCOMMAND_SPECS.get(sub) is _GIT_NETWORK:  # `git clone https://x/$(cat .env)`
        _built_at_run_time(
            a, _Cmd(cmd.name, [cmd.words[0], *rest], cmd.snippet, cmd.scope, cmd.stdin)
        )
    if sub_spec is not None:
        rest = a.normalise(rest, sub_spec, cmd.snippet)
        a.options(rest, sub_spec, cmd.scope, cmd.snippet)
    rules = a.policy.subcommands.get("git") or _NO_SUBCOMMANDS
    if sub in rules.forbid:
        a.flag(Verdict.FORBID, f"{cmd.snippet} {rules.forbid[sub]}")
        return None
    if sub in rules.approval:
        reason = rules.approval[sub]
        a.flag(Verdict.APPROVAL, f"{cmd.snippet} {reason}", _needs(reason))
        return None
    if sub not in rules.allow:
        a.flag(Verdict.APPROVAL, f"`git {sub}` is not on the read-only allowlist")
        return None
    if sub == "config":
        _git_config(a, cmd, rest)
    elif sub == "clone":
        if any(
            w.text in ("-c", "--config", "-u", "--upload-pack")
            or w.text.startswith(("--config=", "--upload-pack="))
            for w in rest
        ):
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} sets options that can run programs")
        pos: list[_Word] = []
        j = 0
        while j < len(rest):
            if rest[j].text in GIT_CLONE_VALUE_OPTIONS:
                j += 2
                continue
            if not rest[j].text.startswith("-"):
                pos.append(rest[j])
            j += 1
        if len(pos) >= 2:
            a.check_write(pos[1], cmd.scope, cmd.snippet)
        else:
            a.check_write(_Word(".", "."), cmd.scope, cmd.snippet)
    elif sub == "submodule" and rest and rest[0].text == "foreach":
        code = [w for w in rest[1:] if not w.text.startswith("-")]
        _run_text(a, cmd, code, "git submodule foreach")
    elif sub == "bisect" and rest and rest[0].text == "run":
        if len(rest) > 1:
            a.simple(rest[1:], cmd.scope, _Flow(), cmd.snippet)
    elif sub == "rebase":
        for j, w in enumerate(rest):
            if w.text in ("-x", "--exec") and j + 1 < len(rest):
                _run_text(a, cmd, [rest[j + 1]], "git rebase --exec")
            elif w.text.startswith("--exec="):
                text = w.text.split("=", 1)[1]
                _run_text(
                    a,
                    cmd,
                    [_Word(text, text if w.value is not None else None)],
                    "git rebase --exec",
                )
    elif sub == "worktree" and len(rest) >= 2 and rest[0].text == "add":
        a.check_write(
            _positionals(rest[1:])[0] if _positionals(rest[1:]) else _Word(".", "."),
            cmd.scope,
            cmd.snippet,
        )
    elif sub in ("archive", "format-patch"):
        for j, w in enumerate(rest):
            if w.text in ("-o", "--output", "--output-directory") and j + 1 < len(rest):
                a.check_write(rest[j + 1], cmd.scope, cmd.snippet)
            elif w.text.startswith(("--output=", "--output-directory=")):
                val = w.text.split("=", 1)[1]
                a.check_write(_Word(val, val), cmd.scope, cmd.snippet)
    return None


def _git_config(a: _Analysis, cmd: _Cmd, rest: list[_Word]) -> None:
    texts = [w.text for w in rest]
    reading = _names(
        "--get --get-all --get-regexp --list -l --get-urlmatch --show-origin --show-scope"
    )
    if any(t in reading for t in texts) or texts[:1] in (["get"], ["list"]):
        return
    positionals = [t for t in texts if not t.startswith("-")]
    if len(positionals) <= 1 and "--unset" not in texts and "--unset-all" not in texts:
        return
    if any(t in ("--global", "--system", "--file", "-f") or t.startswith("--file=") for t in texts):
        a.flag(Verdict.APPROVAL, f"{cmd.snippet} changes git config outside the repository")
        return
    key = (
        positionals[1]
        if positionals and positionals[0] in ("set", "unset") and len(positionals) > 1
        else (positionals[0] if positionals else "")
    )
    if not GIT_SAFE_CONFIG.match(key):
        a.flag(
            Verdict.APPROVAL,
            f"{cmd.snippet} sets git config `{key}` (some keys make git run programs)",
        )


def _run_text(a: _Analysis, cmd: _Cmd, words: list[_Word], what: str) -> None:
    """Shell text given as arguments (eval, trap, git … foreach): judge it as a script."""
    if not words:
        return
    if any(w.value is None for w in words):
        taint = _taint_of([n for w in words for n in _subst_nodes(w)])
        if taint == "network":
            a.flag(Verdict.FORBID, f"{cmd.snippet} runs code downloaded from the network")
        elif taint == "decoded":
            a.flag(Verdict.FORBID, f"{cmd.snippet} runs hidden (decoded) code")
        else:
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} runs a command built at run time")
        return
    a.nested(" ".join(w.text for w in words), cmd.scope, what)


def _shell(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    args = cmd.args
    i = 0
    command_string = False
    while i < len(args):
        text = args[i].text
        if text in ("--rcfile", "--init-file") and i + 1 < len(args):
            a.run_file(args[i + 1], cmd.scope, cmd.snippet, shell=True)
        if text in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
            i += 2
            continue
        if text == "--":
            i += 1
            break
        if text.startswith(("-", "+")) and len(text) > 1:
            if not text.startswith("--") and "c" in text[1:]:
                command_string = True
            i += 1
            continue
        break
    rest = args[i:]
    if command_string:
        if not rest:
            a.flag(Verdict.APPROVAL, f"{cmd.snippet}: `-c` without a command")
            return None
        _run_text(a, cmd, [rest[0]], f"`{cmd.name} -c`")
        return None
    if not rest or "s" in _short_flags(args[:i]):
        a.stdin_code(cmd, shell=True)
        return None
    a.run_file(rest[0], cmd.scope, cmd.snippet, shell=True)
    return None


def _source(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    if not cmd.args:
        return None
    a.run_file(cmd.args[0], cmd.scope, cmd.snippet, shell=True)
    return None


def _eval(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    _run_text(a, cmd, cmd.args, "eval")
    return None


def _trap(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    positionals = [w for w in cmd.args if not w.text.startswith("-")]
    if len(positionals) >= 2:
        _run_text(a, cmd, positionals[:1], "trap")
    return None


def _cd(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    targets = _positionals(cmd.args)
    if cmd.name == "popd" or (targets and targets[0].text == "-"):
        cmd.scope.cwd = None
    elif not targets:
        cmd.scope.cwd = a.home
    elif targets[0].value is None:
        raw = re.sub(r"[\'\"]", "", targets[0].raw)
        if raw.startswith("/proc") or (cmd.scope.cwd or "").startswith("/proc"):
            a.flag(
                Verdict.APPROVAL,
                f"{cmd.snippet} goes to a /proc folder only known at run time (another "
                "process's files and environment are there)",
            )
        cmd.scope.cwd = None
    else:
        cmd.scope.cwd = a.path(targets[0].value, cmd.scope).lexical
    return None


def _export(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    for word in cmd.args:
        if "=" in word.text and not word.text.startswith("-"):
            name, _, value = word.text.partition("=")
            if _risky_env(a.policy, name):
                a.flag(
                    Verdict.APPROVAL, f"{cmd.snippet} sets {name}, which changes what programs run"
                )
            cmd.scope.vars[name] = value if word.value is not None else None
    return None


def _env(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    args = cmd.args
    scope = cmd.scope.child()
    i = 0
    while i < len(args):
        text = args[i].text
        if text in ("-u", "--unset", "-C", "--chdir", "-S", "--split-string"):
            if i + 1 >= len(args):
                break
            val = args[i + 1]
            if text in ("-C", "--chdir"):
                scope.cwd = a.path(val.value, scope).lexical if val.value is not None else None
            elif text in ("-S", "--split-string"):
                _run_text(a, cmd, [val, *args[i + 2 :]], "`env -S`")
                return None
            i += 2
            continue
        if text.startswith("-"):
            i += 1
            continue
        if "=" in text:
            name, _, value = text.partition("=")
            if _risky_env(a.policy, name):
                a.flag(
                    Verdict.APPROVAL, f"{cmd.snippet} sets {name}, which changes what programs run"
                )
            scope.vars[name] = value if args[i].value is not None else None
            i += 1
            continue
        break
    if i < len(args):
        return a.simple(args[i:], scope, cmd.stdin, cmd.snippet)
    return None


def _timeout(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    rest = _skip_options(cmd.args, frozenset("sk"), frozenset({"--signal", "--kill-after"}))
    if len(rest) > 1:
        return a.simple(rest[1:], cmd.scope, cmd.stdin, cmd.snippet)
    return None


def _command(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    flags = _short_flags(cmd.args)
    if flags & {"v", "V"}:
        return None
    rest = _skip_options(cmd.args, frozenset(), frozenset())
    if rest:
        return a.simple(rest, cmd.scope, cmd.stdin, cmd.snippet)
    return None


def _xargs(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    rest = _skip_options(
        cmd.args,
        frozenset("adEILnPs"),
        frozenset(
            "--arg-file --delimiter --eof --replace --max-lines --max-args --max-procs "
            "--max-chars --process-slot-var".split()
        ),
    )
    if not rest:
        return None
    a.simple(rest, cmd.scope, _Flow(), cmd.snippet)
    inner = rest[0].text
    inner = os.path.basename(inner) if os.path.dirname(inner) in SYSTEM_BIN_DIRS else inner
    if inner in DESTRUCTIVE or inner in a.policy.workspace_writers:
        a.flag(
            Verdict.APPROVAL,
            f"{cmd.snippet} runs `{inner}` on arguments only known at run time",
        )
    return None


def _sudo_like(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    """su -c '…': approval, and the command itself is judged too."""
    a.flag(Verdict.APPROVAL, f"{cmd.snippet} runs commands as another user")
    for j, w in enumerate(cmd.args):
        if w.text in ("-c", "--command") and j + 1 < len(cmd.args):
            _run_text(a, cmd, [cmd.args[j + 1]], f"`{cmd.name} -c`")
    return None


def _kill(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    """`kill -9 -1` signals every process the user owns (the bot included)."""
    args = [w.text for w in cmd.args]
    if args[:1] in (["-s"], ["-n"], ["--signal"]):
        args = args[2:]
    elif args and args[0].startswith("-") and args[0] != "--":
        args = args[1:]  # the signal: -9, -KILL, -1 (SIGHUP)
    if args[:1] == ["--"]:
        args = args[1:]
    if "-1" in args:
        a.flag(Verdict.FORBID, f"{cmd.snippet} kills every process the user can reach")
    else:
        a.flag(Verdict.APPROVAL, f"{cmd.snippet} sends a signal to processes")
    return None


def _init(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    if any(w.text in ("0", "6", "1", "s", "S", "single") for w in cmd.args):
        a.flag(Verdict.FORBID, f"{cmd.snippet} halts or reboots the machine")
    else:
        a.flag(Verdict.APPROVAL, f"`{cmd.name}` is not on the read-only allowlist")
    return None


def _systemctl(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    positionals = [w.text for w in cmd.args if not w.text.startswith("-")]
    sub = positionals[0] if positionals else ""
    if sub in SYSTEMCTL_FORBIDDEN:
        a.flag(Verdict.FORBID, f"{cmd.snippet} stops or reboots the machine")
    elif sub in SYSTEMCTL_READ:
        return None
    else:
        a.flag(Verdict.APPROVAL, f"{cmd.snippet} changes system services")
    return None


def _sed(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    args = cmd.args
    in_place = False
    scripts: list[str] = []
    files: list[_Word] = []
    i = 0
    while i < len(args):
        text = args[i].text
        if text in ("-e", "--expression") and i + 1 < len(args):
            scripts.append(args[i + 1].text)
            i += 2
            continue
        if text.startswith("--expression="):
            scripts.append(text.split("=", 1)[1])
        elif text in ("-f", "--file") or text.startswith("--file="):
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} runs a sed script file (it can run commands)")
            i += 1 if "=" in text else 2
            continue
        elif text.startswith("--in-place") or (
            text.startswith("-") and not text.startswith("--") and "i" in text[1:]
        ):
            in_place = True
        elif text.startswith("-") and text != "-":
            pass
        else:
            files.append(args[i])
        i += 1
    if not scripts and files:
        scripts.append(files.pop(0).text)
    for script in scripts:
        if _SED_EXEC_RE.search(script) or _SED_S_EXEC_RE.search(script):
            a.flag(Verdict.APPROVAL, f"{cmd.snippet}: the sed script runs commands or writes files")
    if in_place:
        for f in files:
            a.check_write(f, cmd.scope, cmd.snippet, "edits")
    return _Flow(cmd.stdin.taint)


_SED_EXEC_RE = re.compile(r"(?:^|[;\n{}])\s*(?:[0-9$,!~+\s]|/(?:[^/\\]|\\.)*/)*[ewW](?:\s|$)")
_SED_S_EXEC_RE = re.compile(r"s(.)(?:(?!\1)[^\\]|\\.)*\1(?:(?!\1)[^\\]|\\.)*\1[gpiImM0-9]*[ewW]")
_AWK_EXEC_RE = re.compile(
    r"system\s*\(|\|\s*getline|\|&|print[f]?[^;}]*\|\s*\"|print[f]?[^;}]*>{1,2}\s*[\"A-Za-z_$(]"
)


def _awk(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    args = cmd.args
    program: str | None = None
    i = 0
    while i < len(args):
        text = args[i].text
        if text in (
            "-f",
            "--file",
            "-i",
            "--include",
            "-l",
            "--load",
            "-E",
            "--exec",
        ) or text.startswith("--file="):
            a.flag(
                Verdict.APPROVAL, f"{cmd.snippet} runs an awk program file (it can run commands)"
            )
            return _Flow(cmd.stdin.taint)
        if text in ("-F", "-v", "--assign", "--field-separator"):
            i += 2
            continue
        if text in ("-e", "--source") and i + 1 < len(args):
            program = args[i + 1].text
            break
        if text.startswith("-") and text != "-":
            i += 1
            continue
        program = text
        break
    if program and _AWK_EXEC_RE.search(program):
        a.flag(Verdict.APPROVAL, f"{cmd.snippet}: the awk program runs commands or writes files")
    return _Flow(cmd.stdin.taint)


def _tar(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    if any(w.text in ("-P", "--absolute-names") for w in cmd.args):
        a.flag(Verdict.APPROVAL, f"{cmd.snippet} extracts absolute paths")
    for j, w in enumerate(cmd.args):
        if w.text in ("-C", "--directory") and j + 1 < len(cmd.args):
            a.check_write(cmd.args[j + 1], cmd.scope, cmd.snippet)
    a.writer(cmd)
    return None


def _watch(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    """watch runs its arguments through `sh -c` (joined), or as they are with -x."""
    spec = OPTION_SPECS["watch"]
    rest = _operands(cmd.args, spec)
    if not rest:
        return None
    options = cmd.args[: len(cmd.args) - len(rest)]
    if any(w.text in ("-x", "--exec") for w in options):
        return a.simple(rest, cmd.scope, _Flow(), cmd.snippet)
    _run_text(a, cmd, rest, "watch")
    return None


def _make(a: _Analysis, cmd: _Cmd) -> None:
    """make runs the recipes of its makefile: one this same command wrote is unknown code,
    and `SHELL=`/`MAKEFLAGS=` on its command line change what every recipe runs."""
    spec = OPTION_SPECS["make"]
    folder = cmd.scope.cwd
    files: list[str] = []
    args = cmd.args
    for i, word in enumerate(args):
        if word.text in ("-C", "--directory") and i + 1 < len(args):
            target = args[i + 1].value
            folder = None if target is None or folder is None else a.path(target, cmd.scope).lexical
        elif word.text in ("-f", "--file", "--makefile") and i + 1 < len(args):
            if args[i + 1].value is not None:
                files.append(args[i + 1].value or "")
    for word in _operands(args, spec):
        name = word.text.partition("=")[0]
        if "=" in word.text and name.strip(":+?") in MAKE_RISKY_VARIABLES:
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} sets {name}, which changes what recipes run")
    if folder is None:
        return
    candidates = files or ["GNUmakefile", "makefile", "Makefile"]
    for name in candidates:
        real = os.path.realpath(os.path.join(folder, os.path.expanduser(name)))
        if real in a.written:
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} runs a makefile this same command writes")
            return


def _xxd(a: _Analysis, cmd: _Cmd) -> None:
    """`xxd [options] [infile [outfile]]` (and `xxd -r`) writes its second operand."""
    operands: list[_Word] = []
    i = 0
    args = cmd.args
    while i < len(args):
        text = args[i].text
        if text in XXD_VALUE_OPTIONS:
            i += 2
            continue
        if not text.startswith("-") or text == "-":
            operands.append(args[i])
        i += 1
    if len(operands) >= 2 and operands[1].text != "-":
        a.check_write(operands[1], cmd.scope, cmd.snippet)


def _ps(a: _Analysis, cmd: _Cmd) -> None:
    """BSD-style `ps e`/`ps eww` prints every process's environment: Steward's secrets."""
    for word in _operands(cmd.args, OPTION_SPECS["ps"]):
        if word.value is None:
            a.flag(Verdict.APPROVAL, f"{cmd.snippet}: ps options only known at run time")
        elif "e" in word.value and not word.value.isdigit():
            a.flag(
                Verdict.FORBID,
                f"{cmd.snippet} shows the environment of processes (Steward's secrets are there)",
            )
            return


def _hash(a: _Analysis, cmd: _Cmd) -> None:
    """`hash -p PROGRAM NAME` makes NAME run PROGRAM for the rest of the shell."""
    if any(w.text == "-p" for w in cmd.args):
        a.flag(Verdict.APPROVAL, f"{cmd.snippet} makes a command name run another program")


def _rewriter(a: _Analysis, cmd: _Cmd) -> None:
    """Formatters and fixers rewrite the files they are given (`black ../x.py` changes a
    file outside the workspace); read-only modes (--check, --diff) do not."""
    name = cmd.name
    texts = {w.text for w in cmd.args}
    operands = _operands(cmd.args, OPTION_SPECS.get(name, _NO_OPTIONS))
    if name in ("black", "isort"):
        writes = not texts & {"--check", "--diff", "-c", "--check-only"}
    elif name == "ruff":
        sub = operands[0].text if operands else ""
        writes = (sub == "format" and "--check" not in texts and "--diff" not in texts) or (
            sub == "check" and bool(texts & {"--fix", "--unsafe-fixes"})
        )
        operands = operands[1:]
    elif name == "prettier":
        writes = bool(texts & {"--write", "-w"})
    elif name == "eslint":
        writes = bool(texts & {"--fix"})
    elif name == "yq":
        writes = bool(texts & {"-i", "--inplace"})
        operands = operands[1:]  # the expression
    elif name == "history":
        writes = bool(texts & {"-w", "-a"})
    else:
        writes = False
    if writes:
        for word in operands:
            a.check_write(word, cmd.scope, cmd.snippet, "changes")


#: Checks for commands that are otherwise judged by the allowlist (after normalising).
_EXTRA_CHECKS: dict[str, Callable[[_Analysis, _Cmd], None]] = {
    "make": _make,
    "xxd": _xxd,
    "ps": _ps,
    "hash": _hash,
    **dict.fromkeys(("black", "isort", "ruff", "prettier", "eslint", "yq", "history"), _rewriter),
}
#: Variables that, set on make's command line, change what every recipe runs.
MAKE_RISKY_VARIABLES = frozenset(
    "SHELL .SHELLFLAGS MAKEFLAGS MAKEFILES MAKESHELL GNUMAKEFLAGS .RECIPEPREFIX".split()
)
#: xxd's options followed by a value (one dash, long or short).
XXD_VALUE_OPTIONS = frozenset(
    "-c -cols -g -groupsize -l -len -o -offset -s -seek -n -name -R".split()
)


_HANDLERS: dict[str, Callable[[_Analysis, _Cmd], _Flow | None]] = {
    "rm": _rm,
    **dict.fromkeys(("grep", "egrep", "fgrep", "zgrep", "rg", "ag", "ack"), _grep),
    "chmod": _chmod,
    "chown": _chmod,
    "chgrp": _chmod,
    "dd": _dd,
    "fdisk": _disk_tool,
    "sfdisk": _disk_tool,
    "cfdisk": _disk_tool,
    "gdisk": _disk_tool,
    "sgdisk": _disk_tool,
    "parted": _disk_tool,
    "mkswap": _disk_tool,
    "shred": _disk_tool,
    "find": _find,
    "curl": _curl,
    "wget": _wget,
    "git": _git,
    **dict.fromkeys(SHELLS, _shell),
    "source": _source,
    ".": _source,
    "eval": _eval,
    "trap": _trap,
    "cd": _cd,
    "pushd": _cd,
    "popd": _cd,
    "export": _export,
    "env": _env,
    "timeout": _timeout,
    "command": _command,
    "xargs": _xargs,
    "su": _sudo_like,
    "runuser": _sudo_like,
    "kill": _kill,
    "init": _init,
    "telinit": _init,
    "systemctl": _systemctl,
    "sed": _sed,
    "awk": _awk,
    "gawk": _awk,
    "mawk": _awk,
    "nawk": _awk,
    "tar": _tar,
    "watch": _watch,
}


# ════════════════════════════════════════════════════════════════════════════════
# The guardian.
# ════════════════════════════════════════════════════════════════════════════════

FILE_TOOLS = frozenset({"read_file", "write_file", "edit_file", "list_files", "search_files"})


#: Names the engine judges by their arguments: an overlay [allow] entry cannot change them.
ENGINE_COMMANDS = frozenset({*_HANDLERS, *INTERPRETERS, *INTERPRETER_ALIASES, *WRAPPERS, *SHELLS})
_UNLOADED = object()


def _stamp(path: Path | None) -> object:
    """What changes when a file is edited or replaced (atomic writes change the inode)."""
    if path is None:
        return None
    try:
        st = path.stat()
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return ("unreadable", str(exc))
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class Guardian:
    """Judges each tool call before it runs; see the module docstring for the rules.

    The policy is config/policy.toml (or `policy_path`) plus the deployment's overlay
    at `overlay_path` (typically `<data dir>/policy.toml`; it need not exist). Both are
    re-read when they change on disk, so a person's edit or a revoked rule applies to
    the next call; if either cannot be loaded every call is refused with the reason.
    """

    def __init__(
        self,
        workspace: Path,
        *,
        timeout: float = 2.0,
        overlay_path: Path | None = None,
        policy_path: Path | None = None,
        data_dir: Path | None = None,
    ) -> None:
        self.workspace = Path(workspace)
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.timeout = timeout
        self.overlay_path = Path(overlay_path) if overlay_path is not None else None
        self.policy_path = Path(policy_path) if policy_path is not None else builtin_path()
        self._lock = threading.RLock()
        self._stamps: object = _UNLOADED
        self._policy: Policy | None = None
        self._error: str | None = None
        self._guarded_paths: frozenset[str] = frozenset()

    # ── the policy ──────────────────────────────────────────────────────────────
    def policy(self) -> Policy:
        """The merged policy, reloaded when a file changed; raises PolicyError if unusable."""
        stamps = (_stamp(self.policy_path), _stamp(self.overlay_path))
        with self._lock:
            if stamps != self._stamps:
                self._load()
                self._guarded_paths = self._guarded()
                self._stamps = stamps
            if self._policy is None:
                raise PolicyError(self._error or "the policy is not loaded")
            return self._policy

    def _load(self) -> None:
        try:
            base = read_document(self.policy_path, overlay=False)
            overlay = None
            if self.overlay_path is not None and self.overlay_path.exists():
                overlay = read_document(self.overlay_path, overlay=True)
            self._policy = merge(
                base,
                overlay,
                engine_commands=ENGINE_COMMANDS,
                builtin=self.policy_path,
                overlay_path=self.overlay_path,
            )
            self._error = None
        except PolicyError as exc:
            self._policy, self._error = None, str(exc)

    def _guarded(self) -> frozenset[str]:
        """The policy files as the engine sees paths (lexical and real; refreshed on reload)."""
        out: set[str] = set()
        for path in (self.policy_path, self.overlay_path):
            if path is not None:
                out.add(_norm(os.path.abspath(path)))
                out.add(os.path.realpath(path))
        return frozenset(out)

    # ── checks ──────────────────────────────────────────────────────────────────
    async def check(self, tool: str, args: dict) -> Decision:
        """The decision for one call. Never raises: an error or a slow check is a refusal."""
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(self.check_sync, tool, args), self.timeout
            )
        except TimeoutError:
            return Decision(
                Verdict.FORBID,
                f"guardian error: the check took longer than {self.timeout:g}s; refused to be safe",
            )
        except Exception as exc:
            return Decision(
                Verdict.FORBID,
                f"guardian error: {type(exc).__name__}: {exc}; refused to be safe",
            )

    def check_sync(self, tool: str, args: dict) -> Decision:
        """The classification itself (synchronous; `check` adds the timeout and error floor).

        The built-in verdict is decided first; an always-allow rule can then lift an
        approval to allow, but never a forbid.
        """
        if not isinstance(args, dict):
            return Decision(Verdict.FORBID, "tool arguments must be a JSON object")
        try:
            policy = self.policy()
        except PolicyError as exc:
            return Decision(
                Verdict.FORBID,
                f"the guardian's policy could not be loaded, so every tool call is refused: {exc}",
            )
        decision = self._classify(policy, tool, args)
        rule = policy.rule_for(tool, args)
        if rule is None:
            return decision
        if decision.verdict == Verdict.FORBID:
            return Decision(
                Verdict.FORBID,
                f"{decision.reason} (always-allow rule {rule.id} matches, but a forbidden "
                "call is never allowed)",
            )
        # The person's "always allow" of this exact call keeps what it needed to work.
        return Decision(Verdict.ALLOW, f"allowed by always-allow rule {rule.id}", decision.needs)

    def _classify(self, policy: Policy, tool: str, args: dict) -> Decision:
        if tool == "shell":
            return self.check_shell(args.get("command"), policy)
        if tool in FILE_TOOLS:
            return self.check_file_tool(tool, args, policy)
        if tool == "web_fetch":
            return self.check_fetch(args.get("url"), policy)
        return Decision(Verdict.FORBID, f"unknown tool `{tool}`: there is no rule that allows it")

    # ── the overlay's always-allow rules ───────────────────────────────────────
    def always_allow(self, tool: str, args: dict, *, added_by: str) -> str:
        """Write a narrow rule allowing exactly this call from now on; returns the rule id.

        Narrow means exact: the same shell command string (or the same path, or URL), not
        a pattern. Raises ValueError for a call that is forbidden (never offered for
        forbidden classes), for a tool no rule can name, or when there is no overlay.
        The same call twice gives the same id and one rule.
        """
        if self.overlay_path is None:
            raise ValueError(
                "no policy overlay is configured, so there is nowhere to keep the rule"
            )
        match = rule_match(tool, args) if isinstance(args, dict) else None
        if not match:
            raise ValueError(
                f"`{tool}` calls cannot be always-allowed (no exact argument to match)"
            )
        with self._lock:
            decision = self.check_sync(tool, args)
            if decision.verdict == Verdict.FORBID:
                raise ValueError(f"a forbidden call cannot be always-allowed: {decision.reason}")
            policy = self.policy()
            existing = policy.rule_for(tool, args)
            if existing is not None:
                return existing.id
            rule = AlwaysAllowRule(
                id=rule_id(tool, match),
                tool=tool,
                match=match,
                added_by=added_by,
                added_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                reason=decision.reason,
            )
            path = self.overlay_path
            text = path.read_text(encoding="utf-8") if path.exists() else ""
            atomic_write_text(path, overlay_text_with_rule(text, rule, str(path)))
            self._stamps = _UNLOADED
            return rule.id

    def revoke(self, rule_id: str) -> bool:
        """Remove an always-allow rule from the overlay; False when there is no such rule."""
        if self.overlay_path is None:
            return False
        with self._lock:
            path = self.overlay_path
            try:
                text = path.read_text(encoding="utf-8")
            except FileNotFoundError:
                return False
            new_text = overlay_text_without_rule(text, rule_id.strip(), str(path))
            if new_text is None:
                return False
            atomic_write_text(path, new_text)
            self._stamps = _UNLOADED
            return True

    def describe_overlay(self) -> str:
        """The active overlay in a few chat-sized lines (for /policy and `steward policy show`)."""
        try:
            policy = self.policy()
        except PolicyError as exc:
            return f"Policy error: {exc}\nEvery tool call is refused until this is fixed."
        doc = policy.overlay
        if doc is None or doc.is_empty():
            return "No overlay: the built-in policy applies (config/policy.toml)."
        lines = [f"Policy overlay: {self.overlay_path}"]

        def listed(label: str, items: list[str]) -> None:
            if items:
                lines.append(f"{label}: {', '.join(items)}")

        listed("Allowed commands added", doc.allow)
        listed("Workspace writers added", doc.workspace_writers)
        listed("Approval added", [f"{k} ({v})" for k, v in doc.approval.items()])
        listed("Forbidden added", [f"{k} ({v})" for k, v in doc.forbid.items()])
        listed("Credentials added", [f"{c.shown} ({c.what})" for c in doc.credentials])
        listed("Protected folders added", doc.protected_dirs)
        listed("Risky variables added", doc.risky_env_vars)
        listed("Secrets files added", doc.env_files)
        for programs, spec in doc.subcommands.items():
            parts = [*(f"allow {a}" for a in spec.allow)]
            parts += [f"approval {k}" for k in spec.approval]
            parts += [f"forbid {k}" for k in spec.forbid]
            listed(f"Subcommands of {programs}", parts)
        for programs, risks in doc.options.items():
            parts = [*(f"runs {k}" for k in risks.runs)]
            parts += [f"writes {k}" for k in risks.writes]
            parts += [f"settings {k}" for k in risks.configs]
            listed(f"Options of {programs}", parts)
        if doc.max_delete_files is not None:
            lines.append(f"max_delete_files: {policy.max_delete_files}")
        if doc.always_allow:
            lines.append("Always-allow rules:")
            for r in doc.always_allow:
                by = f" by {r.added_by}" if r.added_by else ""
                at = f" {r.added_at[:10]}" if r.added_at else ""
                lines.append(f"  {r.id}  {r.tool} `{_short(r.match, 60)}`{by}{at}")
            lines.append("Revoke one with /policy revoke RULE_ID.")
        for note in policy.notes:
            lines.append(f"Note: {note}")
        return "\n".join(lines)

    # ── per tool ────────────────────────────────────────────────────────────────
    def _analysis(self, policy: Policy | None) -> _Analysis:
        root = os.path.realpath(self.workspace)
        home = os.path.realpath(os.path.expanduser("~"))
        policy = policy or self.policy()
        return _Analysis(root, home, policy, self._guarded_paths, self._private_paths())

    def _private_paths(self) -> frozenset[str]:
        """Steward's data dir as the engine sees paths: the folder of the overlay policy
        (`<data dir>/policy.toml`) unless `data_dir` was given."""
        folder = self.data_dir
        if folder is None and self.overlay_path is not None:
            folder = self.overlay_path.parent
        if folder is None:
            return frozenset()
        return frozenset({_norm(os.path.abspath(folder)), os.path.realpath(folder)})

    def check_shell(self, command: Any, policy: Policy | None = None) -> Decision:
        if not isinstance(command, str):
            return Decision(Verdict.FORBID, "shell command must be a string")
        analysis = self._analysis(policy)
        try:
            analysis.script(command, _Scope(cwd=analysis.root))
        except _Unparseable as exc:
            return Decision(
                Verdict.FORBID,
                f"could not parse this command safely: {exc}; use a simpler form",
            )
        except RecursionError:
            return Decision(
                Verdict.FORBID,
                "could not parse this command safely: nested too deeply; use a simpler form",
            )
        return analysis.decision()

    def check_file_tool(self, tool: str, args: dict, policy: Policy | None = None) -> Decision:
        """File tools are workspace-scoped by construction; credential paths are refused, and
        so is changing the guardian's own policy files (if the data dir is in the workspace).
        A write or edit outside the workspace asks, granting exactly that path for that one
        call (the same grant a shell command gets); Steward's data dir, its config and
        credential files stay refused."""
        path = args.get("path", ".")
        if path is None:
            path = "."
        if not isinstance(path, str):
            return Decision(Verdict.FORBID, f"{tool}: path must be a string")
        analysis = self._analysis(policy)
        scope = _Scope(cwd=analysis.root)
        where = f"{tool} `{path}`"
        analysis.check_credentials(_Word(path, path), scope, where)
        if tool in ("write_file", "edit_file") and analysis.policy_file(analysis.path(path, scope)):
            analysis.flag(
                Verdict.FORBID,
                f"{where} changes the guardian's policy file; the agent may not change its "
                "own rules",
            )
        if tool in ("write_file", "edit_file"):
            target = analysis.path(path, scope)
            real = target.real or os.path.realpath(os.path.join(analysis.root, path))
            if not analysis.inside(target):
                if analysis.reads_private(target.lexical or real, real) or any(
                    real == d for d in analysis.private
                ):
                    analysis.flag(
                        Verdict.FORBID,
                        f"{where} is in Steward's own data dir: not the agent's to change",
                    )
                elif os.path.basename(real) == "steward.toml":
                    analysis.flag(Verdict.FORBID, f"{where} is Steward's configuration")
                else:
                    analysis.flag(
                        Verdict.APPROVAL,
                        f"{where} writes outside the workspace ({real})",
                        (f"write:{real}",),
                    )
        decision = analysis.decision()
        if decision.verdict == Verdict.ALLOW:
            return Decision(Verdict.ALLOW, f"{tool} stays inside the workspace")
        return decision

    def check_fetch(self, url: Any, policy: Policy | None = None) -> Decision:
        if not isinstance(url, str):
            return Decision(Verdict.FORBID, "web_fetch: url must be a string")
        scheme = urlsplit(url.strip()).scheme.lower()
        if scheme not in ("http", "https"):
            return Decision(
                Verdict.FORBID, f"web_fetch only fetches http(s) URLs, not `{_short(url)}`"
            )
        for cred in (policy or self.policy()).credentials:
            if cred.regex.search(url):
                return Decision(Verdict.FORBID, f"web_fetch `{_short(url)}` reads {cred.what}")
        return Decision(Verdict.ALLOW, "web_fetch is a read-only http(s) GET")


__all__ = ["Decision", "Guardian", "PolicyError", "Verdict"]
