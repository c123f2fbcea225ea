// The course site's code blocks (course-layout.css styles them):
//  - every line of a code cell, an output or a code block becomes its own block (span.course-line), so a long
//    line wraps inside the page's width and its continuation rows are indented behind an arrow;
//  - a long traceback is folded: its last lines (the exception and its message) stay in view, a button above
//    them shows the frames.
// The copy buttons (sphinx-copybutton) copy a pre's text: each line keeps its "\n", so the copied text is the
// code as written.
(() => {
  const FOLD_AFTER = 10;  // tracebacks of more lines than this are folded
  const zh = document.documentElement.lang.startsWith("zh");
  const label = (n, open) => open ? (zh ? "隐藏回溯的调用栈" : "Hide the traceback's frames")
    : (zh ? `显示完整的回溯（另有 ${n} 行）` : `Show the full traceback (${n} more lines)`);

  // Split a <pre>'s children into one span per line; an element (a Pygments token) that spans a line break is
  // cut in two, with a shallow copy of it on the next line.
  function splitLines(pre) {
    const lines = [];
    let line, open = [];  // open: copies of the elements we are inside, on the current line
    const newLine = () => {
      line = document.createElement("span");
      line.className = "course-line";
      lines.push(line);
      open = open.map((el, i) => {
        const copy = el.cloneNode(false);
        (i ? open[i - 1] : line).appendChild(copy);
        return copy;
      });
    };
    const target = () => open.length ? open[open.length - 1] : line;
    const walk = (node) => {
      for (const child of [...node.childNodes]) {
        if (child.nodeType === Node.TEXT_NODE) {
          child.data.split("\n").forEach((part, i) => {
            if (i) {
              target().appendChild(document.createTextNode("\n"));
              newLine();
            }
            if (part) target().appendChild(document.createTextNode(part));
          });
        } else if (child.nodeType === Node.ELEMENT_NODE) {
          const copy = child.cloneNode(false);
          target().appendChild(copy);
          open.push(copy);
          walk(child);
          open.pop();
        }
      }
    };
    newLine();
    walk(pre);
    if (!line.textContent) lines.pop();  // the newline that ends the block
    pre.replaceChildren(...lines);
    pre.classList.add("course-lines");
    return lines;
  }

  // The first line of the exception at the end of a traceback: the last line that starts in column 0 and is
  // not the "Traceback (most recent call last):" header.
  function errorStart(lines) {
    for (let i = lines.length - 1; i > 0; i--) {
      const text = lines[i].textContent;
      if (/^[A-Za-z_][\w.]*(:|$)/.test(text) && !/^Traceback \(/.test(text)) return i;
    }
    return -1;
  }

  function foldTraceback(pre, lines) {
    const start = errorStart(lines);
    if (lines.length <= FOLD_AFTER || start < 3) return;
    const frames = document.createElement("span");
    frames.className = "course-traceback-frames";
    frames.hidden = true;
    frames.append(...lines.slice(0, start));
    pre.prepend(frames);
    const button = document.createElement("button");
    button.type = "button";
    button.className = "course-traceback-toggle";
    button.setAttribute("aria-expanded", "false");
    button.textContent = label(start, false);
    button.addEventListener("click", () => {
      frames.hidden = !frames.hidden;
      button.setAttribute("aria-expanded", String(!frames.hidden));
      button.textContent = label(start, !frames.hidden);
    });
    pre.before(button);
    pre.closest(".output").classList.add("course-traceback-folded");
  }

  function run() {
    for (const pre of document.querySelectorAll("article div.highlight > pre")) {
      if (pre.classList.contains("course-lines")) continue;
      const lines = splitLines(pre);
      if (pre.closest(".output.traceback")) foldTraceback(pre, lines);
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run);
  else run();
})();
