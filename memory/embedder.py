"""Text → vector, pluggable: a hashed n-gram embedder by default, litellm when configured.

Why a hashed embedder by default: Steward must recall "similar past tasks" on a fresh,
offline install. Real models either need torch (1.6 GB, ~430 sentences/s here) or
weights downloaded from a hub, which this deployment cannot assume. Signed feature
hashing of word stems, stem bigrams and character 3–5-grams needs nothing but numpy,
is deterministic across processes and machines (crc32 and fixed mixing constants, not
Python's salted hash()), and embeds thousands of short texts per second.

What it can do: texts that share words, word stems or pieces of words land close
("the deploy failed because a variable was missing" ~ "missing DEPLOY_TOKEN env var
broke the release": deploy, missing, var/variable). What it cannot do: synonyms with
no letters in common ("server is down" vs "host unreachable"), paraphrase, or another
language. Set STEWARD_EMBEDDING_MODEL to a litellm embedding model for that; the index
records which embedder built it and re-embeds everything when it changes, so two
vector spaces are never mixed.

512 dimensions, not 384: hashing noise between unrelated texts has a standard
deviation of about 1/sqrt(dim), and short chat requests have few features, so 384
let chance collisions outrank real matches in our examples; 512 costs 0.5 KB more per
vector (about 50 MB at 100k episodes).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import threading
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any, Protocol, runtime_checkable

import numpy as np

#: Similarity below which a vector hit is noise rather than a related text. Hashed
#: vectors of unrelated short texts score about ±0.05 (up to ~0.1 with a chance
#: collision); hosted models sit higher for unrelated text, so they get their own.
HASHED_MIN_SIMILARITY = 0.12
MODEL_MIN_SIMILARITY = 0.2
#: Buckets per word feature (see HashedEmbedder._word_block).
WORD_PROBES = 4


@runtime_checkable
class Embedder(Protocol):
    """What the memory index needs from an embedder.

    `name` and `dim` identify the vector space: the index stores them and re-embeds
    everything when either changes. `embed` returns float32 rows of unit length, so
    inner product is cosine similarity. It may block (CPU or network): the index
    always calls it off the event loop, or through `aembed` when the embedder has one.
    """

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


async def embed_async(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """Embed without blocking the event loop: native async if offered, else a thread.
    Texts embedded as queries a moment ago are not embedded again (`known_queries`)."""
    aembed = getattr(embedder, "aembed", None)
    if aembed is None:
        return await asyncio.to_thread(embed_rows, embedder, texts)
    known = known_queries(embedder, texts)
    if not known:
        return unit_rows(np.asarray(await aembed(texts), dtype=np.float32))
    missing = [t for i, t in enumerate(texts) if i not in known]
    made = unit_rows(np.asarray(await aembed(missing), dtype=np.float32)) if missing else None
    return _with_known(texts, known, made)


#: Query texts whose embedding is kept per embedder (newest kept): a task's request is
#: asked for twice within milliseconds, and never again after.
SHARED_QUERIES = 16

_shared: weakref.WeakKeyDictionary[Any, OrderedDict[str, Future[np.ndarray]]] = (
    weakref.WeakKeyDictionary()
)
_shared_lock = threading.Lock()


def query_ready(fut: Future[np.ndarray]) -> bool:
    """A shared vector that is there to take (made, not failed)."""
    return fut.done() and fut.exception() is None


def share_query(embedder: Embedder, text: str) -> tuple[Future[np.ndarray], bool]:
    """The future of `text`'s query vector (a read-only unit row), and whether the caller
    owns it: then it must compute the vector and set the future (`settle_query`), even
    on failure. A task's recall (in the index's search thread) and the learner's rule
    matching embed the same request at the same moment; the second one waits for the
    first one's vector instead of making its own (~0.5-1 ms a message with
    rules, an embedding and a thread hop; a network call with a hosted embedder).

    A future that failed or was cancelled is replaced, so an owner that failed leaves
    the next caller to try again. An embedder that cannot be weakly referenced is never
    shared (every caller owns a future of its own)."""
    try:
        with _shared_lock:
            kept = _shared.get(embedder)
            if kept is None:
                kept = _shared[embedder] = OrderedDict()
            fut = kept.get(text)
            if fut is not None and (query_ready(fut) or not fut.done()):  # made, or being made
                kept.move_to_end(text)
                return fut, False
            fut = kept[text] = Future()
            if len(kept) > SHARED_QUERIES:
                kept.popitem(last=False)
            return fut, True
    except TypeError:  # not weakly referenceable
        return Future(), True


def settle_query(fut: Future[np.ndarray], make: Callable[[], np.ndarray]) -> np.ndarray:
    """Compute an owned query vector with `make` (blocking) and hand it to the future's
    other waiters; its error too (they then compute their own)."""
    try:
        row = np.asarray(make(), dtype=np.float32).reshape(-1)
    except BaseException as exc:
        fail_query(fut, exc)
        raise
    row.flags.writeable = False  # shared: a caller that changed it would change all
    with contextlib.suppress(InvalidStateError):
        fut.set_result(row)
    return row


def fail_query(fut: Future[np.ndarray], exc: BaseException) -> None:
    """An owner could not make its vector: its waiters are told with an Exception (never
    the owner's cancellation, which is not theirs) and make their own."""
    if not isinstance(exc, Exception):
        exc = RuntimeError(f"the query was not embedded: {exc!r}")
    with contextlib.suppress(InvalidStateError):
        fut.set_exception(exc)


def query_row(embedder: Embedder, text: str) -> np.ndarray:
    """One query's unit row, computed here (blocking)."""
    row: np.ndarray = embed_rows(embedder, [text])[0]
    return row


async def embed_query(embedder: Embedder, text: str) -> np.ndarray:
    """One query text's unit row (read-only), shared with whoever asks for the same
    text at the same time (`share_query`)."""
    fut, owner = share_query(embedder, text)
    if not owner:
        if query_ready(fut):
            return fut.result()  # no loop turn (wrap_future would take one)
        try:
            # Shielded: a waiter cancelled must not cancel the vector others wait for.
            return await asyncio.shield(asyncio.wrap_future(fut))
        except Exception:  # the owner failed: make our own (or wait for a new owner's)
            fut, owner = share_query(embedder, text)
            if not owner:
                return await asyncio.shield(asyncio.wrap_future(fut))
    if getattr(embedder, "aembed", None) is not None:
        try:
            rows = await embed_async(embedder, [text])
        except BaseException as exc:
            fail_query(fut, exc)
            raise
        return settle_query(fut, lambda: rows[0])
    return await asyncio.to_thread(settle_query, fut, lambda: query_row(embedder, text))


def known_queries(embedder: Embedder, texts: Sequence[str]) -> dict[int, np.ndarray]:
    """Rows of those `texts` embedded as queries a moment ago (by position): a task's
    episode is often its request alone, whose vector recall just made."""
    out: dict[int, np.ndarray] = {}
    try:
        with _shared_lock:
            kept = _shared.get(embedder)
            if not kept:
                return out
            for i, text in enumerate(texts):
                fut = kept.get(text)
                if fut is not None and query_ready(fut):
                    out[i] = fut.result()
    except TypeError:  # not weakly referenceable: nothing shared
        pass
    return out


def _with_known(
    texts: Sequence[str], known: dict[int, np.ndarray], made: np.ndarray | None
) -> np.ndarray:
    """The rows of `texts`: the known ones, and `made` (the others', in order)."""
    out = np.empty((len(texts), next(iter(known.values())).shape[0]), dtype=np.float32)
    rest = iter(made if made is not None else ())
    for i in range(len(texts)):
        out[i] = known[i] if i in known else next(rest)
    return out


def embed_rows(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """`embed_async`'s result computed in the calling thread (blocking): for a caller
    already off the event loop (the index's write thread), where another hop would
    only cost CPU."""
    known = known_queries(embedder, texts)
    if not known:
        return unit_rows(np.asarray(embedder.embed(texts), dtype=np.float32))
    missing = [t for i, t in enumerate(texts) if i not in known]
    made = unit_rows(np.asarray(embedder.embed(missing), dtype=np.float32)) if missing else None
    return _with_known(texts, known, made)


def min_similarity(embedder: Embedder) -> float:
    """The embedder's noise floor for vector hits (see HASHED_MIN_SIMILARITY)."""
    return float(getattr(embedder, "min_similarity", MODEL_MIN_SIMILARITY))


def unit_rows(m: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1 (zero rows stay zero), as contiguous float32."""
    if m.ndim == 1:
        m = m.reshape(1, -1)
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(m / norms, dtype=np.float32)


# Words too common to say anything about a task. Removed before hashing so that
# "the", "a", "to" don't make every pair of requests look alike (there is no IDF).
_STOP = frozenset(
    """a an and are as at be been but by can could did do does for from had has have how
    i if in into is it its me my no not of on or our please so than that the their them
    then there these they this to too us was we were what when where which who why will
    with would you your just also any all some get got because after before again""".split()
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_WORD = re.compile(r"[^\W_]+")
_DIGITS = re.compile(r"\d+")
_SUFFIXES = ("ingly", "edly", "ing", "ies", "ied", "ed", "es", "ly", "s")
_U64 = np.uint64


def _stem(word: str) -> str:
    """A crude suffix stripper: failed/fails/failing → fail. Only for word features;
    character n-grams of the unstemmed word cover what it gets wrong."""
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def _words(text: str) -> list[str]:
    """Lower-case words, split at camelCase and snake_case, digits folded to 0
    (ids and counts vary between otherwise identical tasks), stop words removed."""
    text = _DIGITS.sub("0", _CAMEL.sub(" ", text)).lower()
    return [w for w in _WORD.findall(text) if w not in _STOP]


_MASK = 2**64 - 1
#: murmur3's 64-bit finalizer's multipliers.
_MIX1 = 0xFF51AFD7ED558CCD
_MIX2 = 0xC4CEB9FE1A85EC53
#: The word block's multipliers and offset (a word's hash, a bigram's hash).
_UNIGRAM = 0x9E3779B97F4A7C15
_BIGRAM_MUL = 0x100000001B3
_BIGRAM_ADD = 0x51ED27


def _mix(h: np.ndarray) -> np.ndarray:
    """murmur3's 64-bit finalizer: spreads every input bit over the whole hash."""
    with np.errstate(over="ignore"):
        h = h ^ (h >> _U64(33))
        h = h * _U64(_MIX1)
        h = h ^ (h >> _U64(33))
        h = h * _U64(_MIX2)
        mixed: np.ndarray = h ^ (h >> _U64(33))
        return mixed


def _mix_int(h: int) -> int:
    """`_mix` on one Python integer of 64 bits."""
    h ^= h >> 33
    h = (h * _MIX1) & _MASK
    h ^= h >> 33
    h = (h * _MIX2) & _MASK
    return h ^ (h >> 33)


#: The character n-grams' polynomial multiplier (the 64-bit FNV prime).
_FNV = 1099511628211
_PRIME = _U64(_FNV)
#: What each character n-gram size's seed (size * golden ratio) contributes after
#: `size` steps of `h * _PRIME + byte`: seed * _PRIME**size, mod 2**64.
_SEED_TERM = {size: _U64((size * _UNIGRAM) * pow(_FNV, size, 2**64) % 2**64) for size in (3, 4, 5)}
#: The salt of each word probe, as the word block adds it before mixing.
_PROBE_SALTS = np.array(
    [(probe * 0x632BE59BD9B4E019 + 1) & (2**64 - 1) for probe in range(WORD_PROBES)], dtype=_U64
)


#: A single text of at most this many words (after stop words) has its word block
#: hashed in Python (HashedEmbedder._embed_one): numpy's per-call cost is more there;
#: longer texts and batches go through numpy.
ONE_TEXT_WORDS = 12
#: ... and its character n-grams too when its words take at most this many bytes.
ONE_TEXT_BYTES = 24
_PROBE_SALT_INTS = tuple(int(s) for s in _PROBE_SALTS)
_SEED_TERM_INTS = {size: int(term) for size, term in _SEED_TERM.items()}


class HashedEmbedder:
    """Signed feature hashing: stems + stem bigrams + char 3–5-grams, sublinear tf, L2.

    The two blocks (words, characters) are normalized separately and mixed with
    `char_weight`, so a long text's many character n-grams cannot drown its words.
    All hashing after tokenization runs in numpy over the whole batch.
    """

    min_similarity = HASHED_MIN_SIMILARITY

    def __init__(
        self, dim: int = 512, *, char_weight: float = 0.5, bigram_weight: float = 0.25
    ) -> None:
        if dim < 16:
            raise ValueError("dim must be at least 16")
        self.dim = dim
        self.char_weight = char_weight
        self.bigram_weight = bigram_weight
        self.name = f"hashed-ngram-v1-{dim}"
        self._cache: dict[str, int] = {}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        n = len(texts)
        if n == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        if n == 1 and len(words := _words(texts[0])) <= ONE_TEXT_WORDS:
            return self._embed_one(words)
        rows: list[int] = []
        hashes: list[int] = []
        pieces: list[bytes] = []
        for row, text in enumerate(texts):
            words = _words(text)
            hashes += self._stem_hashes(words)
            rows.extend([row] * len(words))
            pieces.append(_piece(words))
        word_block = self._word_block(rows, hashes, n)
        char_block = self._char_ngrams(pieces)
        return unit_rows(_finish(word_block) + self.char_weight * _finish(char_block))

    def _embed_one(self, words: list[str]) -> np.ndarray:
        """`embed([text])` for one text of a few words (a search's query; `words` is
        `_words(text)`): its word features hashed with Python integers (mod 2**64, as
        numpy's uint64 wraps) and summed in a list, its character n-grams by the batch
        code.

        Why: for a handful of words numpy's per-call cost is the whole cost of the word
        block (~15 calls for ~30 hashes), and a query is embedded while the person waits
        for the reply (recall). The result is bit for bit the batch path's:
        every weight is a power of two (±1, ±bigram_weight), so the sums are exact in
        any order, and the blocks go through the same _finish and unit_rows. A test
        compares the two on thousands of texts."""
        hashes = self._stem_hashes(words)
        features = [((h * _UNIGRAM) & _MASK, 1.0) for h in hashes]
        bigram = self.bigram_weight
        features += [
            (_mix_int((a * _BIGRAM_MUL + b + _BIGRAM_ADD) & _MASK), bigram)
            for a, b in itertools.pairwise(hashes)
        ]
        dim = self.dim
        word: dict[int, float] = {}
        for feature, weight in features:
            for salt in _PROBE_SALT_INTS:
                h = _mix_int((feature + salt) & _MASK)
                bucket = h % dim
                word[bucket] = word.get(bucket, 0.0) + (-weight if h >> 63 else weight)
        # Filled sparsely: a dense row from a Python list of 512 floats costs more
        # (~30 µs) than all of the hashing above.
        blocks = np.zeros((2, dim))
        blocks[0, list(word)] = list(word.values())
        piece = _piece(words)
        if len(piece) <= ONE_TEXT_BYTES:
            chars = _char_counts(piece, dim)
            blocks[1, list(chars)] = list(chars.values())
        else:
            blocks[1] = self._char_ngrams([piece])[0]
        # One _finish for both rows: each row is scaled on its own, as in the batch path.
        word_row, char_row = _finish(blocks)
        return unit_rows(word_row + self.char_weight * char_row)

    def _stem_hashes(self, words: list[str]) -> list[int]:
        """crc32 of each word's stem, remembered by word (at most ~200k words: the
        memory is dropped whole past that)."""
        cache = self._cache
        if len(cache) > 200_000:
            cache.clear()
        hashes = []
        for w in words:
            h = cache.get(w)
            if h is None:
                h = cache[w] = zlib.crc32(_stem(w).encode("utf-8"))
            hashes.append(h)
        return hashes

    def _word_block(self, rows: list[int], hashes: list[int], n: int) -> np.ndarray:
        """Unigram and bigram features of every text in the batch.

        `hashes` are the crc32 of each word's stem, `rows` the text each came from;
        a bigram's hash mixes two neighbouring stems of the same text.
        """
        dim = self.dim
        if not hashes:
            return np.zeros((n, dim), dtype=np.float64)
        r = np.asarray(rows, dtype=np.int64)
        h = np.asarray(hashes, dtype=_U64)
        same = r[:-1] == r[1:]
        with np.errstate(over="ignore"):
            pair = h[:-1][same] * _U64(_BIGRAM_MUL) + h[1:][same] + _U64(_BIGRAM_ADD)
            allh = np.concatenate([h * _U64(_UNIGRAM), _mix(pair)])
        allr = np.concatenate([r, r[:-1][same]])
        weight = np.ones(len(allh))
        weight[len(h) :] = self.bigram_weight
        # Each word goes to WORD_PROBES buckets with independent signs: the same
        # expected noise, but a chance collision between two unrelated short texts
        # costs 1/WORD_PROBES of a shared word instead of a whole one. All probes at
        # once (one row each): a chat request has a handful of words, so numpy's
        # per-call cost, not the arithmetic, is what a loop over probes paid for.
        with np.errstate(over="ignore"):
            ph = _mix(allh[None, :] + _PROBE_SALTS[:, None])
        idx = allr[None, :] * dim + (ph % _U64(dim)).astype(np.int64)
        wts = np.where((ph >> _U64(63)) & _U64(1), -weight, weight)
        # Exact whatever the order: every weight is ±1 or ±bigram_weight (a power of two).
        return np.bincount(idx.ravel(), weights=wts.ravel(), minlength=n * dim).reshape(n, dim)

    def _char_ngrams(self, pieces: list[bytes]) -> np.ndarray:
        """Character 3-, 4- and 5-grams (of the UTF-8 bytes) of every text in the batch,
        by a rolling polynomial hash; n-grams that would span two texts are dropped."""
        n, dim = len(pieces), self.dim
        lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=n)
        data = np.frombuffer(b"".join(pieces), dtype=np.uint8).astype(_U64)
        owner = np.repeat(np.arange(n, dtype=np.int64), lengths)
        hashes, owners = [], []
        with np.errstate(over="ignore"):
            # The polynomial of the first `size` bytes, grown one byte at a time and
            # shared by the three sizes; each size then adds its own seed times
            # P**size (the same value as hashing from that seed: arithmetic mod 2**64).
            poly = np.zeros(len(data), dtype=_U64)
            for size in range(1, 6):
                count = len(data) - size + 1
                if count <= 0:
                    break
                poly = poly[:count] * _PRIME + data[size - 1 : size - 1 + count]
                if size < 3:
                    continue
                valid = owner[:count] == owner[size - 1 : size - 1 + count]
                hashes.append((poly + _SEED_TERM[size])[valid])
                owners.append(owner[:count][valid])
            if not hashes:
                return np.zeros((n, dim), dtype=np.float64)
            h = _mix(np.concatenate(hashes))
        rows = np.concatenate(owners)
        buckets = (h % _U64(dim)).astype(np.int64)
        signs = np.where((h >> _U64(63)) & _U64(1), -1.0, 1.0)
        # One bincount for all sizes: the sums of ±1 are exact in any order.
        return np.bincount(rows * dim + buckets, weights=signs, minlength=n * dim).reshape(n, dim)


def _char_counts(piece: bytes, dim: int) -> dict[int, float]:
    """`HashedEmbedder._char_ngrams([piece])[0]`'s non-zero buckets, in Python
    integers, for one short text: the same polynomial hashes, mixes, buckets and signs,
    summed in another order (exact: every weight is ±1). Below ONE_TEXT_BYTES this is
    cheaper than the dozen numpy calls of the batch path; above, numpy is."""
    counts: dict[int, float] = {}
    end = len(piece)
    for start in range(end - 2):
        poly = 0
        for size in range(1, min(5, end - start) + 1):
            poly = (poly * _FNV + piece[start + size - 1]) & _MASK
            if size >= 3:
                h = _mix_int((poly + _SEED_TERM_INTS[size]) & _MASK)
                bucket = h % dim
                counts[bucket] = counts.get(bucket, 0.0) + (-1.0 if h >> 63 else 1.0)
    return counts


def _piece(words: list[str]) -> bytes:
    """A text's words as its character n-grams are taken from: space-separated, with a
    space at each end (so a word's first and last letters start and end n-grams)."""
    return (" " + " ".join(words) + " ").encode("utf-8")


def _finish(block: np.ndarray) -> np.ndarray:
    """Sublinear tf (a word said five times is not five times the topic), then L2."""
    block = np.sign(block) * np.log1p(np.abs(block))
    norms = np.linalg.norm(block, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    unit: np.ndarray = block / norms
    return unit


class LiteLLMEmbedder:
    """A hosted or local embedding model through litellm (STEWARD_EMBEDDING_MODEL).

    litellm is imported on first use only: it takes seconds to import, and a
    hashed-embedder install never needs it. `load` imports it: Steward passes its own
    loader (core.model.client.load_litellm: offline, no cost-map download), as memory may not
    import core, and whichever of the agent and the embedder asks first imports it
    for both; without one it is a plain import. `dim` is learned from the first answer
    unless given; MemoryIndex.open asks once when it is 0.
    """

    min_similarity = MODEL_MIN_SIMILARITY

    def __init__(
        self,
        model: str,
        *,
        dim: int = 0,
        batch_size: int = 64,
        load: Callable[[], Any] | None = None,
        **litellm_kwargs: Any,
    ) -> None:
        if not model.strip():
            raise ValueError(
                "an embedding model name is required, e.g. openai/text-embedding-3-small"
            )
        self.model = model
        self.name = f"litellm:{model}"
        self.dim = dim
        self.batch_size = batch_size
        self.kwargs = litellm_kwargs
        self._load = load or _import_litellm
        self._litellm: Any = None  # the module, once loaded
        #: Told (model, input tokens, cost or None) after each call, as the server
        #: reported it: the app records it in the usage ledger (memory may not import core).
        self.on_usage: Callable[[str, int, float | None], None] | None = None

    def _used(self, response: Any) -> None:
        if self.on_usage is None:
            return
        usage = response.get("usage") if isinstance(response, dict) else response.usage
        if isinstance(usage, dict):
            tokens = usage.get("prompt_tokens") or usage.get("total_tokens") or 0
        else:
            tokens = getattr(usage, "prompt_tokens", 0) or getattr(usage, "total_tokens", 0) or 0
        hidden = getattr(response, "_hidden_params", None) or {}
        cost = hidden.get("response_cost") if isinstance(hidden, dict) else None
        self.on_usage(self.model, int(tokens), float(cost) if cost is not None else None)

    def _loaded(self) -> Any:
        self._litellm = self._load()
        return self._litellm

    def _rows(self, response: Any) -> np.ndarray:
        data = response["data"] if isinstance(response, dict) else response.data
        vectors = [d["embedding"] if isinstance(d, dict) else d.embedding for d in data]
        m = np.asarray(vectors, dtype=np.float32)
        if not self.dim:
            self.dim = int(m.shape[1])
        elif m.shape[1] != self.dim:
            raise ValueError(f"{self.model} returned {m.shape[1]} dimensions, expected {self.dim}")
        return m

    def _empty(self) -> np.ndarray:
        return np.zeros((0, self.dim), np.float32)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        litellm = self._litellm or self._loaded()
        parts = []
        for chunk in _chunks(texts, self.batch_size):
            response = litellm.embedding(model=self.model, input=list(chunk), **self.kwargs)
            parts.append(self._rows(response))
            self._used(response)
        return unit_rows(np.vstack(parts)) if parts else self._empty()

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        # Loading takes seconds, so the first call loads in a thread; later ones (a
        # recall's query, each message) make no thread hop for it.
        litellm = self._litellm or await asyncio.to_thread(self._loaded)
        parts = []
        for chunk in _chunks(texts, self.batch_size):
            response = await litellm.aembedding(model=self.model, input=list(chunk), **self.kwargs)
            parts.append(self._rows(response))
            self._used(response)
        return unit_rows(np.vstack(parts)) if parts else self._empty()


def _chunks(items: Sequence[str], size: int) -> list[Sequence[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _import_litellm() -> Any:
    import litellm

    return litellm


def make_embedder(
    model: str | None = None, *, load: Callable[[], Any] | None = None, **litellm_kwargs: Any
) -> Embedder:
    """The configured embedder: litellm when a model is named (imported by `load`, see
    LiteLLMEmbedder), else the hashed default."""
    if model and model.strip():
        return LiteLLMEmbedder(model.strip(), load=load, **litellm_kwargs)
    return HashedEmbedder()
