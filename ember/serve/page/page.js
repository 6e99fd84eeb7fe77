// The page of `ember serve`: one tab per inference method, a form built from the method's
// declared fields, the response drawn by the view the method names (see __init__.py).
(function () {
  "use strict";
  var config = JSON.parse(document.getElementById("ember-config").textContent);

  // -- small DOM helpers (text always goes in as text, never as HTML) --------------------------
  function el(tag, attrs) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (key) {
      if (key === "text") node.textContent = attrs[key];
      else if (key === "className") node.className = attrs[key];
      else node.setAttribute(key, attrs[key]);
    });
    for (var i = 2; i < arguments.length; i++) {
      var child = arguments[i];
      if (child === null || child === undefined) continue;
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }
  function pct(p) { return (100 * p).toFixed(1) + "%"; }
  function num(x, digits) { return x === null || x === undefined ? "–" : Number(x).toFixed(digits); }
  function bar(label, p, best) {
    return [el("span", {className: best ? "best" : "", text: label}),
            el("div", {className: "track"}, el("div", {className: "fill", style: "width:" + (100 * p).toFixed(2) + "%"})),
            el("span", {className: "value", text: pct(p)})];
  }
  function bars(rows) {  // rows: [[label, probability]], best first
    var box = el("div", {className: "bars"});
    rows.forEach(function (row, i) { bar(row[0], row[1], i === 0).forEach(function (n) { box.appendChild(n); }); });
    return box;
  }
  function truncatedNote(response) {
    return response.truncated ? el("p", {className: "note", text: "The input was longer than the model's " +
      config.max_length + " tokens and was truncated."}) : null;
  }

  // -- views: response (+ the request body) -> DOM ------------------------------------------
  var views = {
    classify: function (response) {
      var r = response.results[0];
      if (r.score !== undefined) return el("p", {className: "verdict"}, "Score: ", el("strong", {text: num(r.score, 3)}));
      var rows = Object.keys(r.probabilities).map(function (k) { return [k, r.probabilities[k]]; });
      rows.sort(function (a, b) { return b[1] - a[1]; });
      return el("div", {}, el("p", {className: "verdict"}, "Label: ", el("strong", {className: "label", text: r.label})),
                bars(rows), truncatedNote(response));
    },
    "fill-mask": function (response) {
      var box = el("div", {});
      response.masks.forEach(function (candidates, i) {
        box.appendChild(el("p", {className: "verdict", text: "Mask " + (i + 1) + ": " + candidates[0].token}));
        box.appendChild(bars(candidates.map(function (c) { return [c.token, c.probability]; })));
      });
      return box;
    },
    tag: function (response) {
      var r = response.results[0], box = el("p", {className: "words"}), i = 0;
      var starts = {};
      r.entities.forEach(function (e) { starts[e.start] = e; });
      while (i < r.words.length) {
        var e = starts[i];
        if (e) {
          box.appendChild(el("mark", {className: "ent ent-" + e.type, title: e.type},
                             r.words.slice(e.start, e.end).join(" "), el("sub", {text: e.type})));
          i = e.end;
        } else {
          box.appendChild(document.createTextNode(r.words[i]));
          i += 1;
        }
        box.appendChild(document.createTextNode(" "));
      }
      var table = el("table", {className: "tags"}, el("tr", {}, el("th", {text: "word"}), el("th", {text: "tag"})));
      r.words.forEach(function (w, k) { table.appendChild(el("tr", {}, el("td", {text: w}), el("td", {text: r.tags[k]}))); });
      var summary = r.entities.length ? r.entities.length + " entities" : "no entities";
      return el("div", {}, el("p", {className: "verdict", text: summary}), box,
                el("details", {}, el("summary", {text: "tags per word"}), table), truncatedNote(r));
    },
    answer: function (response, body) {
      var span = response.best_span, context = body.context || "", at = span ? context.indexOf(span) : -1;
      var shown = el("div", {className: "context"});
      if (at >= 0) {
        shown.appendChild(document.createTextNode(context.slice(0, at)));
        shown.appendChild(el("mark", {className: "answer", text: span}));
        shown.appendChild(document.createTextNode(context.slice(at + span.length)));
      } else {
        shown.appendChild(document.createTextNode(context));
      }
      var verdict = response.answer ? el("p", {className: "verdict"}, "Answer: ", el("strong", {className: "label", text: response.answer}))
        : el("p", {className: "verdict", text: "No answer (the no-answer score beats the best span" +
                    (span ? " \u201c" + span + "\u201d" : "") + ")"});
      var table = el("table", {}, el("tr", {}, el("th", {text: "span"}), el("th", {text: "score"})));
      response.nbest.forEach(function (n) { table.appendChild(el("tr", {}, el("td", {text: n.text}), el("td", {text: num(n.score, 2)}))); });
      return el("div", {}, verdict, shown, el("p", {className: "note", text: "Best spans:"}), table);
    },
    generate: function (response, body) {
      var box = el("div", {});
      response.results.forEach(function (r, i) {
        var prompt = body.prompt !== undefined ? body.prompt : (body.prompts || [])[i];
        box.appendChild(el("div", {className: "continuation"}, el("span", {className: "prompt", text: prompt}),
                           el("span", {className: "generated", text: r.text})));
        box.appendChild(el("p", {className: "note", text: r.generated_tokens + " new tokens, stopped by " +
          r.finish_reason.replace(/_/g, " ") + (response.settings.seed !== null ? ", seed " + response.settings.seed : ", greedy") +
          (r.truncated ? "; the prompt was cut from the left to fit the context" : "")}));
      });
      return box;
    },
    embed: function (response, body) {
      var texts = body.texts || [body.text], vectors = response.results.map(function (r) { return r.embedding; });
      function cosine(a, b) {
        var dot = 0, na = 0, nb = 0;
        for (var k = 0; k < a.length; k++) { dot += a[k] * b[k]; na += a[k] * a[k]; nb += b[k] * b[k]; }
        return dot / Math.max(Math.sqrt(na * nb), 1e-12);
      }
      var table = el("table", {className: "similarity"});
      var head = el("tr", {}, el("th", {}));
      texts.forEach(function (t, j) { head.appendChild(el("th", {text: "#" + (j + 1), title: t})); });
      table.appendChild(head);
      texts.forEach(function (t, i) {
        var row = el("tr", {}, el("th", {className: "text", text: "#" + (i + 1) + " " + t}));
        texts.forEach(function (_, j) {
          var s = cosine(vectors[i], vectors[j]), shade = Math.round(255 - 150 * Math.max(0, s));
          row.appendChild(el("td", {style: "background: rgb(" + shade + "," + shade + ",255)", text: s.toFixed(3)}));
        });
        table.appendChild(row);
      });
      return el("div", {}, el("p", {className: "verdict", text: "Cosine similarity of " + texts.length +
        " sentences (" + response.dimension + "-dimensional vectors)"}), table);
    },
    score: function (response, body) {
      var texts = body.texts || [body.text];
      var table = el("table", {className: "scores"}, el("tr", {}, el("th", {text: "text"}), el("th", {text: "log-likelihood"}),
        el("th", {text: "tokens"}), el("th", {text: "perplexity"})));
      response.results.forEach(function (r, i) {
        table.appendChild(el("tr", {}, el("td", {text: texts[i]}), el("td", {text: num(r.log_likelihood, 3)}),
          el("td", {text: String(r.tokens)}), el("td", {text: num(r.perplexity, 2)})));
      });
      return table;
    },
    json: function (response) { return el("pre", {text: JSON.stringify(response, null, 2)}); }
  };

  // -- forms -------------------------------------------------------------------------------
  function input(method, field) {
    var id = "field-" + method.name + "-" + field.name, node;
    if (field.type === "textarea" || field.type === "lines") {
      node = el("textarea", {id: id, name: field.name, rows: field.type === "lines" ? 5 : 3});
      node.value = field["default"] !== undefined ? field["default"] : "";
    } else if (field.type === "select") {
      node = el("select", {id: id, name: field.name});
      (field.options || []).forEach(function (o) { node.appendChild(el("option", {value: o, text: o})); });
      if (field["default"] !== undefined) node.value = field["default"];
    } else if (field.type === "checkbox") {
      node = el("input", {id: id, name: field.name, type: "checkbox"});
      node.checked = !!field["default"];
    } else {
      node = el("input", {id: id, name: field.name, type: field.type === "number" ? "number" : "text"});
      ["min", "max", "step"].forEach(function (k) { if (field[k] !== undefined) node.setAttribute(k, field[k]); });
      if (field.type === "number" && field.step === undefined) node.setAttribute("step", "any");
      node.value = field["default"] !== undefined ? field["default"] : "";
    }
    return node;
  }

  function readField(form, field) {  // the field's JSON value, or undefined to leave it out
    if (field.type === "hidden") return field.value;
    var node = form.elements[field.name];
    if (field.type === "checkbox") return node.checked;
    var raw = node.value;
    if (field.type === "lines") {
      var lines = raw.split("\n").map(function (s) { return s.trim(); }).filter(function (s) { return s; });
      return lines.length || !field.optional ? lines : undefined;
    }
    if (raw.trim() === "") return field.optional || field.type === "number" ? undefined : raw;
    if (field.type === "number") { var n = Number(raw); return isNaN(n) ? raw : n; }
    return raw;
  }

  function buildSection(method) {
    var form = method.form || {title: method.name, view: "json", fields: [
      {name: "__json__", label: "Request body (JSON)", type: "textarea", "default": "{}"}]};
    var section = el("section", {id: "method-" + method.name, className: "method", role: "tabpanel"});
    var formNode = el("form", {id: "form-" + method.name});
    var row = el("div", {className: "row"});
    form.fields.forEach(function (field) {
      if (field.type === "hidden") return;
      var wrap = el("div", {}, el("label", {"for": "field-" + method.name + "-" + field.name, text: field.label || field.name}),
                    input(method, field));
      if (field.type === "number" || field.type === "select" || field.type === "checkbox") row.appendChild(wrap);
      else formNode.appendChild(wrap);
    });
    if (row.childNodes.length) formNode.appendChild(row);
    var button = el("button", {type: "submit", id: "submit-" + method.name, text: form.title || method.name});
    formNode.appendChild(button);
    var result = el("div", {id: "result-" + method.name, className: "result", "aria-live": "polite"});
    section.appendChild(el("p", {className: "note"}, "POST ", el("code", {text: method.endpoint})));
    section.appendChild(formNode);
    section.appendChild(result);

    formNode.addEventListener("submit", function (event) {
      event.preventDefault();
      var body = {};
      try {
        if (!method.form) body = JSON.parse(formNode.elements.__json__.value);
        else form.fields.forEach(function (f) { var v = readField(formNode, f); if (v !== undefined) body[f.name] = v; });
      } catch (err) {
        result.replaceChildren(el("div", {className: "error", role: "alert", text: "Not valid JSON: " + err.message}));
        return;
      }
      button.disabled = true;
      result.replaceChildren(el("p", {className: "note", text: "Running\u2026"}));
      fetch(method.endpoint, {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)})
        .then(function (response) {
          return response.text().then(function (text) {
            var data;
            try { data = JSON.parse(text); } catch (err) { data = {error: text || response.statusText}; }
            if (!response.ok) throw new Error((data && data.error) || ("HTTP " + response.status));
            return data;
          });
        })
        .then(function (data) {
          var view = views[form.view] || views.json;
          result.replaceChildren(view(data, body),
            el("details", {}, el("summary", {text: "request and response"}),
               el("pre", {text: "POST " + method.endpoint + "\n" + JSON.stringify(body, null, 2)}),
               el("pre", {text: JSON.stringify(data, null, 2)})));
        })
        .catch(function (err) {
          var message = err instanceof TypeError ? "Could not reach the server (" + err.message + ")" : err.message;
          result.replaceChildren(el("div", {className: "error", role: "alert", text: message}));
        })
        .then(function () { button.disabled = false; });
    });
    return section;
  }

  // -- the page ------------------------------------------------------------------------------
  var m = config.model;
  document.title = "ember \u00b7 " + m.display_name;
  document.getElementById("model-name").textContent = m.display_name;
  document.getElementById("model-summary").textContent = [m.family + " (" + m.num_layers + " layers, hidden " + m.hidden_size + ")",
    "backend " + config.backend, "max length " + config.max_length + " tokens",
    m.labels ? "labels: " + m.labels.join(", ") : null].filter(Boolean).join(" \u00b7 ");
  var tabs = document.getElementById("tabs"), main = document.getElementById("methods");
  config.methods.forEach(function (method, i) {
    var section = buildSection(method);
    var tab = el("button", {id: "tab-" + method.name, role: "tab", "aria-selected": i === 0 ? "true" : "false",
                            text: (method.form && method.form.title) || method.name});
    section.hidden = i !== 0;
    tab.addEventListener("click", function () {
      Array.prototype.forEach.call(tabs.children, function (t) { t.setAttribute("aria-selected", "false"); });
      Array.prototype.forEach.call(main.children, function (s) { s.hidden = true; });
      tab.setAttribute("aria-selected", "true");
      section.hidden = false;
    });
    tabs.appendChild(tab);
    main.appendChild(section);
  });
})();
