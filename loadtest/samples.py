"""French text for the load tests, written for this project (never lines of a training or test
corpus): several lengths and styles, from a caption to a short news item.

Plain data with no Locust import, so that tests can read it without Locust's gevent patching.
"""

from __future__ import annotations

# One sentence each: captions, everyday remarks, questions, instructions.
SHORT_SENTENCES: tuple[str, ...] = (
    "Une femme promène son chien le long du canal.",
    "Deux garçons construisent un château de sable.",
    "Le boulanger sort le pain du four.",
    "Un cycliste attend au feu rouge.",
    "Il fait froid ce matin.",
    "Où se trouve la gare la plus proche ?",
    "Merci beaucoup pour votre aide.",
    "La réunion commence à dix heures.",
    "Une vieille dame nourrit les pigeons sur la place.",
    "Trois musiciens jouent de la guitare devant le café.",
    "Fermez la porte avant de partir.",
    "Un enfant en pull jaune grimpe à un arbre.",
    "Les élèves écoutent le professeur en silence.",
    "Un pêcheur répare son filet sur le quai.",
    "Pouvez-vous parler plus lentement, s'il vous plaît ?",
    "Une joueuse de tennis frappe la balle avec force.",
    "Le train pour Lyon a vingt minutes de retard.",
    "Un homme en costume lit ses messages sur son téléphone.",
    "Des touristes prennent des photos devant la cathédrale.",
    "Une fillette souffle les bougies de son gâteau.",
)

# Several sentences each, as a client sends a paragraph: the service splits and rejoins them.
PARAGRAPHS: tuple[str, ...] = (
    "Un homme en veste orange nettoie la rue. Derrière lui, un camion avance lentement. "
    "Quelques passants traversent la chaussée.",
    "La cuisine est petite mais lumineuse. Une femme coupe des légumes sur la table. "
    "Son fils la regarde en mangeant une pomme. Le chat dort près de la fenêtre.",
    "Le marché ouvre tôt le samedi. Les marchands installent leurs étals de fruits. "
    "Une odeur de café flotte dans l'air.",
    "Deux amis marchent dans la montagne. Le sentier devient de plus en plus raide. "
    "Ils s'arrêtent pour boire de l'eau et regarder la vallée.",
    "Hier soir, un orage a éclaté au-dessus de la ville. Plusieurs arbres sont tombés. "
    "Les pompiers sont intervenus toute la nuit. Personne n'a été blessé.",
    "Versez la farine dans un grand bol. Ajoutez les œufs et le lait. "
    "Mélangez doucement jusqu'à obtenir une pâte lisse. Laissez reposer une heure.",
    "Un groupe d'enfants joue au football dans un parc. Un ballon rouge roule vers le lac. "
    "Un chien court le chercher. Tout le monde rit.",
    "La bibliothèque municipale ferme à dix-huit heures. Les lecteurs rendent leurs livres "
    "au comptoir. Une employée range les étagères.",
)


def batch_of_texts(start: int, count: int) -> list[str]:
    """`count` short sentences from position `start`, wrapping around: a list request's body."""
    return [SHORT_SENTENCES[(start + i) % len(SHORT_SENTENCES)] for i in range(count)]
