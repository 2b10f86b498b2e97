"""What the browser tools read off a page: the element a target names, whether clicking
it submits a form or typing into it gives a password away, and the page as text.

A target is a CSS selector or visible text (a button's or link's name, a field's label
or placeholder, any text on the page), tried in that order; the first visible match is
used, and the answer says when there were several.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from core.tools.base import ToolError

if TYPE_CHECKING:
    from playwright.async_api import Locator, Page

#: Matches of one target checked for visibility, at most.
MAX_CANDIDATES = 20
#: Controls listed under a page's text, at most.
MAX_CONTROLS = 40

#: Facts about the element a click or a typing acts on (run in the page).
INSPECT = """
(el) => {
  const control = el.closest('button, input, select, textarea, a, [role=button]') || el;
  const tag = control.tagName.toLowerCase();
  const type = (control.getAttribute('type') || '').toLowerCase();
  const form = control.form || control.closest('form');
  let submits = false;
  if (form) {
    if (tag === 'button') submits = type === '' || type === 'submit';
    else if (tag === 'input') submits = type === 'submit' || type === 'image';
    const button = tag === 'button' || control.getAttribute('role') === 'button'
      || (tag === 'input' && type === 'button');
    if (!submits && button) {
      // A script may send the form on such a click: count it as a submit when the
      // form holds a password that was filled in.
      submits = [...form.querySelectorAll('input[type=password]')].some((p) => p.value);
    }
  }
  let details = null;
  if (form) {
    const own = submits && control.hasAttribute('formaction');
    const method = own && control.hasAttribute('formmethod') ? control.formMethod : form.method;
    details = {
      method: (method || 'get').toUpperCase(),
      action: own ? control.formAction : form.action,
      name: form.getAttribute('name') || form.id || '',
      fields: [...form.elements].map((e) => e.name).filter((n) => n),
    };
  }
  const text = (control.innerText || control.value || control.getAttribute('aria-label')
    || control.getAttribute('placeholder') || '').trim();
  return {
    tag, type, submits, form: details,
    password: el.tagName.toLowerCase() === 'input'
      && (el.getAttribute('type') || '').toLowerCase() === 'password',
    name: el.getAttribute('name') || el.id || '',
    text: text.slice(0, 80),
  };
}
"""

#: The page's text and its controls (run in the page).
READ = """
(limit) => {
  const shown = (el) => {
    const box = el.getBoundingClientRect();
    const style = getComputedStyle(el);
    return box.width > 0 && box.height > 0 && style.visibility !== 'hidden';
  };
  const labelOf = (el) => ((el.labels && el.labels.length ? el.labels[0].innerText : '')
    || el.getAttribute('aria-label') || el.getAttribute('placeholder') || '').trim();
  const controls = [];
  const all = document.querySelectorAll('a[href], button, input, textarea, select, [role=button]');
  for (const el of all) {
    if (controls.length >= limit) break;
    const tag = el.tagName.toLowerCase();
    const type = (el.getAttribute('type') || '').toLowerCase();
    if (type === 'hidden' || !shown(el)) continue;
    if (tag === 'a') {
      controls.push({kind: 'link', text: el.innerText.trim().slice(0, 80), href: el.href});
    } else if (tag === 'button' || el.getAttribute('role') === 'button'
        || (tag === 'input' && ['submit', 'button', 'reset', 'image'].includes(type))) {
      const text = el.innerText || el.value || el.getAttribute('aria-label') || '';
      controls.push({kind: 'button', text: text.trim().slice(0, 80)});
    } else {
      controls.push({kind: 'field', type: tag === 'input' ? (type || 'text') : tag,
        name: el.name || el.id || '', text: labelOf(el).slice(0, 80)});
    }
  }
  return {text: document.body ? document.body.innerText : '', controls};
}
"""


@dataclass(frozen=True, slots=True)
class Found:
    """The element a target named, and how many elements it matched."""

    locator: Locator
    matches: int
    how: str

    def note(self) -> str:
        if self.matches <= 1:
            return ""
        return f" ({self.matches} elements match {self.how}; the first visible one was used)"


async def locate(page: Page, target: str, *, field: bool) -> Found:
    """The visible element `target` names (module docstring); ToolError when none."""
    if not target.strip():
        raise ToolError("target must be a CSS selector or text on the page: '#login', 'Sign in'")
    candidates: list[tuple[str, Locator]] = [("as a CSS selector", page.locator(f"css={target}"))]
    if field:
        candidates += [
            ("as a label", page.get_by_label(target, exact=True)),
            ("as a placeholder", page.get_by_placeholder(target, exact=True)),
            ("as a field's name", page.get_by_role("textbox", name=target)),
            ("as a label", page.get_by_label(target)),
            ("as a placeholder", page.get_by_placeholder(target)),
        ]
    else:
        candidates += [
            ("as a button's name", page.get_by_role("button", name=target, exact=True)),
            ("as a link's text", page.get_by_role("link", name=target, exact=True)),
            ("as text", page.get_by_text(target, exact=True)),
            ("as a button's name", page.get_by_role("button", name=target)),
            ("as a link's text", page.get_by_role("link", name=target)),
            ("as text", page.get_by_text(target)),
        ]
    hidden = 0
    for how, locator in candidates:
        try:
            count = await locator.count()
        except Exception:  # not a valid CSS selector: it is text, then
            continue
        for i in range(min(count, MAX_CANDIDATES)):
            if await locator.nth(i).is_visible():
                return Found(locator.nth(i), count, how)
        hidden += count
    why = f" ({hidden} match but none is visible)" if hidden else ""
    what = "field" if field else "element"
    raise ToolError(
        f"No visible {what} on the page matches {target[:200]!r} as a CSS selector or as its "
        f"text{why}. browser_text lists the page's controls."
    )


async def inspect(found: Found) -> dict[str, Any]:
    facts: dict[str, Any] = await found.locator.evaluate(INSPECT)
    return facts


def short_url(url: str) -> str:
    """The URL without its query and fragment (what a person needs to recognise it)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url[:200]
    if not parts.scheme or not parts.netloc:
        return url[:200]
    return f"{parts.scheme}://{parts.netloc}{parts.path}"[:200]


def submit_of(facts: dict[str, Any], page_url: str) -> str:
    """What submitting the form means, in words a person can approve ("" when the click
    submits nothing): where it goes and which fields it sends."""
    form = facts.get("form")
    if not facts.get("submits") or not isinstance(form, dict):
        return ""
    name = f' "{form["name"]}"' if form.get("name") else ""
    fields = [str(f) for f in form.get("fields") or []]
    sends = f"; fields: {', '.join(fields[:12])}" if fields else ""
    return (
        f"{form.get('method', 'GET')} {short_url(str(form.get('action') or page_url))} "
        f"(form{name} on {short_url(page_url)}{sends})"
    )


def password_of(facts: dict[str, Any], page_url: str) -> str:
    """The password field typing would fill, in words a person can approve ("" if the
    field is not a password field)."""
    if not facts.get("password"):
        return ""
    name = f' "{facts["name"]}"' if facts.get("name") else ""
    form = facts.get("form")
    where = f"on {short_url(page_url)}"
    if isinstance(form, dict):
        where = f"of the form sent to {short_url(str(form.get('action') or page_url))} {where}"
    return f"the password field{name} {where}"


async def read(page: Page) -> tuple[str, list[str]]:
    """(the page's visible text, one line per control a target can name)."""
    got: dict[str, Any] = await page.evaluate(READ, MAX_CONTROLS)
    lines = [line.strip() for line in str(got.get("text") or "").splitlines()]
    text = "\n".join(line for line in lines if line)
    controls = []
    for c in got.get("controls") or []:
        label = f' "{c["text"]}"' if c.get("text") else ""
        if c.get("kind") == "link":
            controls.append(f"- link{label} → {short_url(str(c.get('href') or ''))}")
        elif c.get("kind") == "button":
            controls.append(f"- button{label}")
        else:
            name = f" name={c['name']}" if c.get("name") else ""
            controls.append(f"- field {c.get('type', 'text')}{name}{label}")
    return text, controls
