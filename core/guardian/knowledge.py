"""Engine knowledge: how programs read their arguments (tables, no logic to speak of).

Which options of each program take a value, which run a program, which wrappers run
the command after them, which devices and kernel files are dangerous. The lists
people edit (allowlist, approval and forbidden commands, credentials, protected
folders, subcommands) are not here: they are in config/policy.toml and reach the
engine as a `Policy` (core/policy.py). Long because it is a table of facts, one
entry per program, read top to bottom; splitting it would only scatter them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

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
#: Read-only programs whose operands are files they read (noted as the call's reads).
READERS = frozenset(
    """cat tac head tail less more wc nl od hexdump strings diff cmp comm sort file stat
    md5sum sha1sum sha256sum sha512sum b2sum cksum jq bat column cut paste fold fmt""".split()
)
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
