# docs/doxygen-filter.awk: the INPUT_FILTER of docs/Doxyfile. The headers document each symbol
# in plain `//` comments above it (one heading comment per public symbol); doxygen reads only
# `///`, so this filter turns whole-line `//` comments into `///` and the file banner (the first
# comment block, `// <path>: what the file defines`) into the file's documentation. One line out
# per line in, so doxygen's line numbers are the header's. Trailing comments (`int x;  // why`)
# are left alone.
#
# The comments are plain text with markdown `code` spans, not doxygen markup: outside code spans
# the characters doxygen would read as markup are escaped (`<name>` as an HTML tag, `#name` and
# `a/std::map` as link requests, `_name` as emphasis, `@cmd` and `\cmd` as commands); code
# examples (below) are left as they are.

# `_name` (an underscore that starts a word) -> `\_name`: markdown would start emphasis there.
function escape_word_start_underscores(s,    out, c, prev, i) {
  out = ""; prev = ""
  for (i = 1; i <= length(s); i++) {
    c = substr(s, i, 1)
    if (c == "_" && prev !~ /[A-Za-z0-9_\\]/) out = out "\\"
    out = out c; prev = c
  }
  return out
}

# `a/std::map` -> `a/std\::map`: doxygen reads it as a link request it cannot resolve.
function escape_scoped_after_slash(s,    out) {
  out = ""
  while (match(s, /\/[A-Za-z_][A-Za-z0-9_]*::/)) {
    out = out substr(s, 1, RSTART + RLENGTH - 3) "\\::"
    s = substr(s, RSTART + RLENGTH)
  }
  return out s
}

function escape_text(s,    n, parts, i, out) {
  n = split(s, parts, "`")
  out = ""
  for (i = 1; i <= n; i++) {
    if (i % 2 == 1) {
      gsub(/\\/, "\\\\", parts[i])
      gsub(/@/, "\\@", parts[i])
      gsub(/</, "\\<", parts[i])
      gsub(/>/, "\\>", parts[i])
      gsub(/#/, "\\#", parts[i])
      parts[i] = escape_word_start_underscores(parts[i])
      parts[i] = escape_scoped_after_slash(parts[i])
    }
    out = out (i > 1 ? "`" : "") parts[i]
  }
  return out
}

# A comment line: `//` -> `///`. An example (3+ spaces after `//`) that follows a blank comment
# line or another example line becomes a markdown code block (5 spaces: doxygen wants 4 more
# than the text's 1) and is not escaped; anything else is text.
function convert(line,    body, indent) {
  match(line, /^[ \t]*\/\//)
  indent = substr(line, 1, RLENGTH - 2)
  body = substr(line, RLENGTH + 1)
  if (body ~ /^   / && (prev_blank || in_code)) {
    in_code = 1; prev_blank = 0
    return indent "///  " body
  }
  in_code = 0
  prev_blank = (body ~ /^[ \t]*$/)
  return indent "///" escape_text(body)
}

function reset() { in_code = 0; prev_blank = 0 }

NR == 1 && /^\/\/ [^ ]+\.h(:|$)/ {
  sub(/^\/\/ [^ ]+\.h:? */, "")
  print "/// " escape_text($0) " @file"
  banner = 1
  next
}
banner && /^\/\// { print convert($0); next }
{ banner = 0 }
/^[ \t]*\/\/ / || /^[ \t]*\/\/$/ { print convert($0); next }
{ reset(); print }
