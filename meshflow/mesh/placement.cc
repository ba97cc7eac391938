// Placement text forms.
#include "meshflow/mesh/placement.h"

#include <charconv>

#include "meshflow/core/error.h"

namespace meshflow {

std::string to_string(const Placement& p) {
  switch (p.kind) {
    case Placement::Kind::kShard:
      return fmt::format("S({})", p.dim);
    case Placement::Kind::kReplicate:
      return "R";
    case Placement::Kind::kPartial:
      return fmt::format("P({})", to_string(p.op));
  }
  return "?";
}

std::string to_string(const std::vector<Placement>& ps) {
  std::string out;
  for (std::size_t i = 0; i < ps.size(); ++i) out += (i ? "," : "") + to_string(ps[i]);
  return out;
}

namespace {

// Splits "Name(arg)" or "Namearg" into head and argument; `had_parens` tells which.
struct Parts {
  std::string head;
  std::string arg;
  bool had_parens = false;
};

Parts split(const std::string& s, std::string_view original) {
  Parts parts;
  std::size_t open = s.find('(');
  if (open != std::string::npos) {
    if (s.back() != ')' || s.find('(', open + 1) != std::string::npos) {
      fail(ErrorKind::kInvalidArgument, "malformed placement \"{}\"", original);
    }
    parts.head = s.substr(0, open);
    parts.arg = s.substr(open + 1, s.size() - open - 2);
    parts.had_parens = true;
    return parts;
  }
  std::size_t digits = s.find_first_of("-0123456789");
  parts.head = s.substr(0, digits);
  if (digits != std::string::npos) parts.arg = s.substr(digits);
  return parts;
}

}  // namespace

Placement parse_placement(std::string_view text) {
  std::string s;
  for (char c : text) {
    if (c != ' ' && c != '\t') s += c;
  }
  if (s.empty()) fail(ErrorKind::kInvalidArgument, "empty placement in \"{}\"", text);
  Parts parts = split(s, text);
  if (parts.head == "R" || parts.head == "Replicate") {
    if (!parts.arg.empty())
      fail(ErrorKind::kInvalidArgument, "malformed placement \"{}\": Replicate takes no argument",
           text);
    return Placement::replicate();
  }
  if (parts.head == "S" || parts.head == "Shard") {
    std::string_view arg = parts.arg;
    if (arg.starts_with("dim=")) arg.remove_prefix(4);
    int dim = 0;
    auto [ptr, ec] = std::from_chars(arg.data(), arg.data() + arg.size(), dim);
    if (arg.empty() || ec != std::errc() || ptr != arg.data() + arg.size()) {
      fail(ErrorKind::kInvalidArgument,
           "malformed placement \"{}\": Shard needs a tensor dim, e.g. S(0)", text);
    }
    return Placement::shard(dim);
  }
  if (parts.head == "P" || parts.head == "Partial") {
    if (parts.arg.empty()) return Placement::partial(ReduceOp::kSum);
    std::string_view arg = parts.arg;
    if (arg.starts_with("reduce_op=")) arg.remove_prefix(10);
    try {
      return Placement::partial(parse_reduce_op(arg));
    } catch (const Error&) {
      fail(ErrorKind::kInvalidArgument,
           "malformed placement \"{}\": unknown Partial op \"{}\" (expected sum, avg, max or min)",
           text, arg);
    }
  }
  fail(ErrorKind::kInvalidArgument,
       "malformed placement \"{}\" (expected S(d), R or P(op), e.g. \"S(0)\")", text);
}

std::vector<Placement> parse_placements(std::string_view text) {
  std::string_view body = text;
  while (!body.empty() && body.front() == ' ') body.remove_prefix(1);
  while (!body.empty() && body.back() == ' ') body.remove_suffix(1);
  if (body.starts_with('[') && body.ends_with(']')) body = body.substr(1, body.size() - 2);
  std::vector<Placement> out;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= body.size(); ++i) {
    if (i < body.size() && body[i] == '(') ++depth;
    if (i < body.size() && body[i] == ')') --depth;
    if (i == body.size() || (body[i] == ',' && depth == 0)) {
      std::string_view part = body.substr(start, i - start);
      if (part.find_first_not_of(" \t") == std::string_view::npos) {
        fail(ErrorKind::kInvalidArgument, "malformed placements \"{}\": empty entry", text);
      }
      out.push_back(parse_placement(part));
      start = i + 1;
    }
  }
  return out;
}

}  // namespace meshflow
