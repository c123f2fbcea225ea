/*
 * The course's search page (search.html alone loads this, after Sphinx's searchtools.js and the build's
 * course-search-data.js; see course_search.py). Sphinx's page stays (Search.init reads ?q=, writes the title,
 * the list and the status line); its Search.query is replaced, so that
 *   - a page ranks by where the query's words matter: in its title, in a section heading, how often in the
 *     prose (outputs and code count half, code once per section), the query's words together as written;
 *     pages that match more of the query's words come first, then the higher score, then the course's order;
 *   - a result links to its best section, with the words to highlight there (?highlight=), and shows an
 *     excerpt around the first match in that section;
 *   - the glossary's English-Chinese pairs are synonyms (pinned memory = 固定内存), and a glossary phrase
 *     written as one identifier counts (data parallelism = DataParallel).
 */
"use strict";

(() => {
  const WEIGHT = {title: 12, heading: 6, page: 2, phrase: 8, code: 0.5, partial: 0.5, landing: 0.5};
  const CJK = /[\u3400-\u9fff]/;
  const WORD = /[\p{L}\p{N}_]+/gu;
  const EXCERPT = 220;  // characters around the first match
  const IN_CODE = document.documentElement.lang.startsWith("zh") ? "代码中：" : "in its code: ";

  const stemmer = new Stemmer();  // language_data.js: Porter's, for English words in both editions
  const stems = new Map();
  const stem = (word) => {
    if (!stems.has(word)) stems.set(word, CJK.test(word) ? word : stemmer.stemWord(word));
    return stems.get(word);
  };
  const words = (text) => text.toLowerCase().match(WORD) || [];

  // A text as searched: its words and their stems, and its lower-case string (Chinese is matched within it).
  const prepare = (text) => {
    const toks = words(text);
    return {toks, stems: toks.map(stem), lower: text.toLowerCase()};
  };

  // An alternative: Chinese (a string, found within the text) or English words, a phrase of one or more.
  const alternative = (text) => {
    if (CJK.test(text)) return text;
    const ws = words(text);
    // The words joined, each cut to what it shares with its stem (parallelism -> parallel, memory -> memor).
    const root = (w) => {
      const s = stem(w);
      let n = 0;
      while (n < w.length && w[n] === s[n]) n++;
      return w.slice(0, n);
    };
    return {stems: ws.map(stem), joined: ws.map(root).join("")};
  };

  // How often an alternative occurs in a prepared text, the forms it has there (to highlight) and the first
  // as written (lower case): the English words with the same stems, consecutive; or one identifier that
  // holds them joined (DataParallel, fully_shard), which counts half unless it is just them. Identifiers that
  // only hold a word are highlighted only where the word itself is not there.
  const occurrences = (alt, text) => {
    const forms = new Set();
    let count = 0;
    let first = null;
    if (typeof alt === "string") {
      for (let i = text.lower.indexOf(alt); i >= 0; i = text.lower.indexOf(alt, i + alt.length)) count++;
      if (count) forms.add(alt), first = alt;
      return {count, forms, first};
    }
    const {stems: want, joined} = alt;
    const partial = new Set();
    for (let i = 0; i < text.toks.length; i++) {
      const tok = text.toks[i];
      if (want.every((s, k) => text.stems[i + k] === s)) {
        count++;
        const run = text.toks.slice(i, i + want.length);
        run.forEach((t) => stopwords.includes(t) || forms.add(t));
        first = first || run.join(" ");
      } else if (joined.length >= 4 && tok.includes(joined)) {
        const whole = want.length > 1 && tok.startsWith(joined) && tok.length <= joined.length + 3;
        count += whole ? 1 : WEIGHT.partial;
        (whole ? forms : partial).add(tok);
        first = first || tok;
      }
    }
    if (!forms.size) partial.forEach((t) => forms.add(t));
    return {count, forms, first};
  };

  // The glossary as synonyms: each English phrase (as stems) and each Chinese rendering leads to the group
  // of everything it is paired with.
  const glossary = () => {
    const english = [];
    const chinese = new Map();
    for (const [en, zh] of COURSE_SEARCH_DATA.synonyms) {
      const phrase = words(en).map(stem);
      if (!phrase.length) continue;
      if (!chinese.has(zh)) chinese.set(zh, [zh]);
      chinese.get(zh).push(alternative(en));
      english.push({phrase, zh});
    }
    english.sort((a, b) => b.phrase.length - a.phrase.length);  // the longest phrase first
    return {english, chinese, chineseTerms: [...chinese.keys()].sort((a, b) => b.length - a.length)};
  };

  // The query as groups of alternatives: a page matches a group when it has any of them.
  const parse = (query) => {
    const {english, chinese, chineseTerms} = glossary();
    const toks = words(query);
    const groups = [];
    const seen = new Set();
    const add = (alts) => {
      const key = JSON.stringify(alts);
      if (!seen.has(key)) seen.add(key), groups.push(alts);
    };
    for (let i = 0; i < toks.length; ) {
      const tok = toks[i];
      if (CJK.test(tok)) {  // a run of Chinese: the glossary's terms in it, longest first; the rest as written
        let rest = tok;
        for (const zh of chineseTerms) {
          if (rest.includes(zh)) {
            add(chinese.get(zh));
            rest = rest.split(zh).join(" ");
          }
        }
        rest.split(" ").filter((r) => r.length > 1).forEach((r) => add([r]));
        i++;
        continue;
      }
      const stemsHere = toks.slice(i).map(stem);
      const entry = english.find(({phrase}) => phrase.every((s, k) => stemsHere[k] === s));
      if (entry) {
        add(chinese.get(entry.zh));
        i += entry.phrase.length;
        continue;
      }
      if (!stopwords.includes(tok) && !/^\d+$/.test(tok)) add([alternative(tok)]);
      i++;
    }
    // Its runs of two words or more that span groups, as phrases (stop words inside: "cuda out of memory" in
    // "how to fix cuda out of memory"), longest first; not for Chinese (no spaces to tell the words apart).
    const phrases = [];
    const end = (t) => t && !stopwords.includes(t);
    if (groups.length > 1 && !CJK.test(query)) {
      const head = toks.slice(0, 12);
      for (let n = head.length; n >= 2; n--) {
        for (let i = 0; i + n <= head.length; i++) {
          if (end(head[i]) && end(head[i + n - 1])) phrases.push(alternative(head.slice(i, i + n).join(" ")));
        }
      }
    }
    return {groups, phrases};
  };

  const match = (alts, text) => {
    let count = 0;
    const forms = new Set();
    for (const alt of alts) {
      const found = occurrences(alt, text);
      count += found.count;
      found.forms.forEach((f) => forms.add(f));
    }
    return {count, forms};
  };

  // One page's score, the number of groups it matches, its best section and the forms found there.
  const rankPage = ([docname, title, sections], {groups, phrases}) => {
    const titleText = prepare(title);
    let matched = 0;
    let score = 0;
    const perSection = sections.map(([id, heading, prose, outputs, code], index) => ({
      id, heading, prose, outputs, index, phrase: null, score: 0, forms: new Set(), codeForms: new Set(),
      texts: [prepare(heading), prepare(prose), prepare(outputs), prepare(code)],
    }));
    for (const alts of groups) {
      const inTitle = match(alts, titleText).count > 0;
      let total = 0;
      for (const s of perSection) {
        const found = s.texts.map((t) => match(alts, t));
        const [head, prose, outputs, code] = found;
        const count = prose.count + WEIGHT.code * (outputs.count + code.count);
        total += count + head.count;
        s.score += (s.index > 0 && head.count ? WEIGHT.heading : 0) + Math.log2(1 + count);
        found.forEach((m) => m.forms.forEach((f) => s.forms.add(f)));
        code.forms.forEach((f) => s.codeForms.add(f));
      }
      if (total > 0 || inTitle) matched++;
      score += (inTitle ? WEIGHT.title : 0) + WEIGHT.page * Math.log2(1 + total);
    }
    for (const phrase of phrases) {
      for (const s of perSection) {
        // In the heading, prose and outputs: the code's words are a list, not a text.
        const found = s.texts.slice(0, 3).map((t) => occurrences(phrase, t)).filter((m) => m.count);
        const count = found.reduce((n, m) => n + m.count, 0);
        s.score += WEIGHT.phrase * Math.min(count, 3);
        if (count && !s.phrase) s.phrase = found[0].first;  // the longest, for the excerpt
      }
    }
    // The best section; the introduction (the first) only when no other section matches as well.
    const best = perSection.reduce(
      (a, b) => (b.score > a.score || (a.index === 0 && b.score > 0 && b.score === a.score) ? b : a));
    score += best.score;
    if (docname === "index") score *= WEIGHT.landing;  // the landing page lists every lesson's topics
    return {docname, title, matched, score, best};
  };

  // A sentence or two around the section's first match (of the whole query, if it is there): in its prose,
  // else in its outputs; else the start of its prose (and the words found in its code, if that is where).
  const excerpt = (section) => {
    for (const forms of [[section.phrase], [...section.forms]]) {
      for (const text of [section.prose, section.outputs]) {
        const lower = text.toLowerCase();
        const at = Math.min(...forms.filter((f) => f).map((f) => lower.indexOf(f)).filter((i) => i >= 0));
        if (!Number.isFinite(at)) continue;
        const start = Math.max(0, text.lastIndexOf(" ", Math.max(0, at - EXCERPT / 3)));
        const end = Math.min(text.length, start + EXCERPT);
        return (start > 0 ? "… " : "") + text.slice(start, end).trim() + (end < text.length ? " …" : "");
      }
    }
    const start = section.prose.slice(0, EXCERPT / 2).replace(/\s\S*$/, "");
    const inCode = section.codeForms.size ? ` (${IN_CODE}${[...section.codeForms].join(", ")})` : "";
    return `${start} …${inCode}`;
  };

  const show = (result) => {
    const {docname, title, best} = result;
    const item = document.createElement("li");
    item.classList.add("kind-text");
    const link = item.appendChild(document.createElement("a"));
    const highlight = [...best.forms].join(" ");
    const anchor = best.index > 0 ? `#${best.id}` : "";
    link.href = `${docname}${DOCUMENTATION_OPTIONS.LINK_SUFFIX}?highlight=${encodeURIComponent(highlight)}${anchor}`;
    link.dataset.score = result.score.toFixed(2);
    link.textContent = best.index > 0 ? `${title} › ${best.heading}` : title;
    const context = item.appendChild(document.createElement("p"));
    context.classList.add("context");
    context.textContent = excerpt(best);
    best.forms.forEach((form) => _highlightText(context, form, "highlighted"));  // sphinx_highlight.js
    Search.output.appendChild(item);
  };

  const rank = (query) => {
    const parsed = parse(query);
    if (!parsed.groups.length) return [];
    const results = COURSE_SEARCH_DATA.pages.map((page) => rankPage(page, parsed)).filter((r) => r.matched > 0);
    const most = Math.max(0, ...results.map((r) => r.matched));
    // Pages that miss more than half of the query's words are left out (all are shown for one or two words).
    return results.filter((r) => r.matched >= Math.min(most, Math.ceil(parsed.groups.length / 2)))
      .sort((a, b) => b.matched - a.matched || b.score - a.score);  // stable: ties stay in course order
  };

  Search.query = (query) => {
    const results = rank(query);
    results.forEach(show);
    _finishSearch(results.length);  // searchtools.js: the title and the status line
  };
  window.CourseSearch = {rank, parse};  // for a look from the browser's console
})();
