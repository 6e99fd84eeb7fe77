"""`ember kg`: knowledge graphs for K-BERT and ERNIE (``ember.knowledge``; docs/knowledge.md).

    ember kg build --wordnet /usr/share/wordnet --out runs/kg/wordnet.tsv
    ember kg embed runs/kg/wordnet.tsv --out runs/kg/wordnet-transe --epochs 50
    ember kg show runs/kg/wordnet.tsv "Tim Cook is visiting Beijing now"
"""

from __future__ import annotations

from ember.durations import duration_arg


def register(sub) -> None:
    p = sub.add_parser("kg", help="build a knowledge graph (WordNet), train TransE entity embeddings",
                       description="Knowledge graphs for `ember finetune --knowledge` (K-BERT) and "
                       "`--entities` (ERNIE): triples files (head<TAB>relation<TAB>tail) and entity embeddings.")
    verbs = p.add_subparsers(dest="kg_command", metavar="<kg verb>")

    b = verbs.add_parser("build", help="convert WordNet 3.0 into a triples file",
                         description="WordNet 3.0's database (Debian: apt-get install wordnet-base) -> triples: "
                         "synonym, is_a (hypernym), instance_of, part_of (part holonym), lemmas in lower case, "
                         "each lemma's commonest senses first.")
    b.add_argument("--wordnet", required=True, metavar="DIR", help="WordNet's database folder (index.noun, data.noun, ...)")
    b.add_argument("--out", required=True, help="triples file to write")
    b.add_argument("--heads", metavar="FILE", help="keep only these lemmas as heads (one per line): a sample")
    b.add_argument("--max-per-head", type=int, default=0, help="at most N triples per lemma (0 = all)")
    b.set_defaults(run=run_build)

    e = verbs.add_parser("embed", help="train TransE entity embeddings on a triples file",
                         description="TransE (Bordes et al. 2013): margin ranking loss on true vs corrupted "
                         "triples, minibatch SGD, entities renormalised each step. Writes OUT/entities.tsv, "
                         "OUT/relations.tsv, OUT/embeddings.safetensors and OUT/transe.json (losses, held-out "
                         "link prediction before/after).")
    e.add_argument("triples", help="triples file (head<TAB>relation<TAB>tail)")
    e.add_argument("--out", required=True, help="folder to write")
    e.add_argument("--relations", help="only these relations (comma-separated)")
    e.add_argument("--dim", type=int, default=100, help="embedding size (default 100, ERNIE's)")
    e.add_argument("--epochs", type=int, default=50, help="passes over the triples (default 50)")
    e.add_argument("--lr", type=float, default=0.01, help="SGD step on the summed minibatch loss (default 0.01)")
    e.add_argument("--margin", type=float, default=1.0, help="gamma of the ranking loss (default 1; §4.2 used 2 "
                   "for WordNet)")
    e.add_argument("--norm", type=int, choices=[1, 2], default=2, help="L1 or L2 distance (default 2; §4.2 used 1 "
                   "for WordNet)")
    e.add_argument("--batch-size", type=int, default=1024, help="triples per step (default 1024)")
    e.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    e.add_argument("--max-time", type=duration_arg, default=0.0, help="stop after this long, e.g. 10m")
    e.set_defaults(run=run_embed)

    s = verbs.add_parser("show", help="print the K-BERT sentence tree of a sentence",
                         description="The entities a graph finds in a sentence and the triples K-BERT injects "
                         "(at most --max-triples per entity), as the flattened tree with soft positions.")
    s.add_argument("triples", help="triples file")
    s.add_argument("text", nargs="+", help="sentence(s)")
    s.add_argument("--max-triples", type=int, default=2, help="triples injected per entity (K-BERT's k; default 2)")
    s.add_argument("--relations", help="only these relations (comma-separated)")
    s.set_defaults(run=run_show)
    p.set_defaults(run=lambda args: p.print_help() or 2)


def run_build(args) -> int:
    from pathlib import Path

    from ember.errors import EmberError
    from ember.knowledge.graph import write_triples
    from ember.knowledge.wordnet import wordnet_triples

    heads = None
    if args.heads:
        try:
            heads = [line.strip() for line in Path(args.heads).read_text(encoding="utf-8").splitlines() if line.strip()]
        except OSError as exc:
            raise EmberError(f"--heads {args.heads}: cannot read ({exc})") from None
    triples = wordnet_triples(args.wordnet, heads, args.max_per_head)
    write_triples(args.out, triples)
    relations = {}
    for t in triples:
        relations[t.relation] = relations.get(t.relation, 0) + 1
    print(f"{len(triples):,} triples ({', '.join(f'{r} {n:,}' for r, n in relations.items())}) over "
          f"{len({t.head for t in triples}):,} head lemmas -> {args.out}")
    return 0


def run_embed(args) -> int:
    from ember.knowledge.graph import read_triples
    from ember.knowledge.transe import TransESettings, train_transe

    graph = read_triples(args.triples, args.relations)
    settings = TransESettings(dim=args.dim, margin=args.margin, norm=args.norm, lr=args.lr,
                              batch_size=args.batch_size, epochs=args.epochs, seed=args.seed, max_time=args.max_time)
    result = train_transe(graph, settings)
    info = {"triples": str(args.triples), "relations_filter": args.relations or "", "num_triples": len(graph),
            "settings": settings.__dict__, "losses": result.losses, "held_out": result.held_out,
            "seconds": result.seconds}
    result.embeddings.save(args.out, info)
    after = result.held_out.get("after", {})
    print(f"{len(result.embeddings.names):,} entities x {settings.dim} -> {args.out} "
          f"({len(result.losses)} epochs, {result.seconds:.0f} s; held-out tail prediction: mean rank "
          f"{after.get('mean_rank', float('nan')):.0f}, hits@10 {after.get('hits_at_10', float('nan')):.3f})")
    return 0


def run_show(args) -> int:
    import re

    from ember.knowledge.graph import read_triples
    from ember.knowledge.inputs import KnowledgeBase
    from ember.knowledge.kbert import Mention, flatten_tree

    base = KnowledgeBase(read_triples(args.triples, args.relations), args.max_triples)
    for text in args.text:
        words = re.findall(r"\w+(?:['’-]\w+)*|[^\w\s]", text)  # words and punctuation, as a tokenizer splits them
        mentions = [Mention(m.start, m.end, base.branches(m.name)) for m in base.index.match(words)]
        flat = flatten_tree(words, mentions)
        print(" ".join(f"{w}/{p}" if b == 0 else f"[{w}/{p}]" for w, p, b in zip(flat.tokens, flat.soft_positions,
                                                                                  flat.branch)))
    return 0

