"""The held-out part of the labelled extraction set: written with the rest, never looked at
while tuning the extractor (see bench/memory_sets/__init__.py)."""

CONVERSATIONS = [
    {"id": "h-name-job", "turns": [
        ("Hello! I'm Priya, and I work as a software engineer in Bangalore.", "Hi Priya!"),
    ], "expect": [["priya"], ["software engineer"]]},
    {"id": "h-vegan", "turns": [
        ("I'm vegan, what protein sources do you recommend?", "Lentils, tofu and tempeh."),
    ], "expect": [["vegan"]]},
    {"id": "h-live-oslo", "turns": [
        ("What jacket should I buy? I live in Oslo and cycle to work.", "A waterproof insulated shell."),
    ], "expect": [["oslo"]]},
    {"id": "h-son", "turns": [
        ("My son is called Leo and he just turned four.", "Happy birthday to Leo!"),
    ], "expect": [["leo"]]},
    {"id": "h-guitar", "turns": [
        ("I've been playing guitar for ten years.", "That's a long time!"),
    ], "expect": [["guitar"]]},
    {"id": "h-lactose", "turns": [
        ("I'm lactose intolerant. Can I eat hard cheese?", "Aged hard cheeses are low in lactose."),
    ], "expect": [["lactose"]]},
    {"id": "h-likes-scifi", "turns": [
        ("I really enjoy science fiction novels. Recommend one?", "Try The Left Hand of Darkness."),
    ], "expect": [["science fiction"]]},
    {"id": "h-learning-piano", "turns": [
        ("I'm learning the piano at 50. Is it too late?", "It's never too late."),
    ], "expect": [["piano"]]},
    {"id": "h-metric", "turns": [
        ("I prefer metric units in answers.", "Noted, I will use metric."),
        ("How tall is Everest?", "8,849 metres."),
    ], "expect": [["metric"]]},
    {"id": "h-wedding", "turns": [
        ("I'm getting married in June and need ideas for a small reception.", "A garden reception is lovely."),
    ], "expect": [["married"]]},
    {"id": "h-accountant", "turns": [
        ("I'm an accountant, so keep the tax explanation technical.", "Of course."),
    ], "expect": [["accountant"]]},
    {"id": "h-from-chile", "turns": [
        ("I'm originally from Chile but now I live in Madrid.", "Bienvenido!"),
    ], "expect": [["chile"], ["madrid"]]},
    {"id": "h-translate-french", "turns": [
        ("Translate to French: My name is John and I work at a hospital.", "Je m'appelle John et je travaille dans un hôpital."),
    ], "expect": []},
    {"id": "h-story-detective", "turns": [
        ("Write a detective story about Inspector Hale, who lives in Edinburgh.", "Inspector Hale lit his pipe..."),
    ], "expect": []},
    {"id": "h-roleplay-wizard", "turns": [
        ("Pretend you are a wizard and I am a young apprentice.", "Welcome, apprentice."),
        ("I have a magic wand made of oak and I live in the tower.", "Indeed you do."),
    ], "expect": []},
    {"id": "h-summarise-article", "turns": [
        ("Summarize the following: I grew up in Ohio and I became a pilot at 25. Flying is my life.", "The author grew up in Ohio and became a pilot."),
    ], "expect": []},
    {"id": "h-world-capital", "turns": [
        ("Which is bigger, Canada or the USA?", "Canada, by total area. I find maps fascinating."),
    ], "expect": []},
    {"id": "h-essay-ocean", "turns": [
        ("Write a long essay about the ocean, with several paragraphs.", "The ocean covers 71% of Earth..."),
    ], "expect": []},
    {"id": "h-typo", "turns": [
        ("Ignore my typo above, what is teh speed of light?", "About 299,792 km/s."),
    ], "expect": []},
    {"id": "h-linkedin", "turns": [
        ("Rewrite this LinkedIn summary to sound better: I am a passionate marketer with 10 years of experience.", "Passionate marketer with a decade of experience..."),
    ], "expect": []},
    {"id": "h-zombie", "turns": [
        ("How do I kill a zombie process in Linux?", "Kill its parent or wait for it to be reaped."),
    ], "expect": []},
    {"id": "h-dialogue", "turns": [
        ("Write a dialogue where a customer says: I want a refund because I am unhappy.", "Customer: I want a refund..."),
    ], "expect": []},
]
